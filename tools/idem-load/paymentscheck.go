package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// paymentRow is a row of the payments service's payments table.
type paymentRow struct {
	account     uuid.UUID
	amount      int64
	processorID string    // "" while not settled
	created     time.Time // its transaction's start
}

// scopedKey is a row of the key table.
type scopedKey struct{ scope, key string }

// reconcilePayments checks the payments run's answers (tallied in fig),
// the last replay of every key and, with a processor, its charges against
// the database:
//
//   - every answer for a key equal (status and body) to the first, and
//     the last replay of the key equal to it too and marked replayed;
//   - a 201 names a payment row of its account and amount, which no other
//     key was answered, with the balance the account had right after that
//     charge: the balances answered on an account must be those of one
//     order of its charges (see chargeOrder);
//   - a 402 is the insufficient-funds problem, for an amount above the
//     account's final balance (balances only fall, so it was above the
//     balance then too), and no payment row stands for it;
//   - every payment row was answered to a client: there is no charge that
//     no one was told of;
//   - each account's balance is its opening balance less its payments, and
//     was never negative;
//   - each key's row in its principal's scope ("account:<id>") is
//     completed for a 201 and refused for a 402; no key row that no client
//     sent; none in progress;
//   - with a processor: every payment settled by exactly one charge, made
//     under the key derived from its request's, for its account and
//     amount, and recorded on the payment; no charge for anything else; no
//     call rejected; one completed settlement job per payment.
func reconcilePayments(ctx context.Context, dbURL string, s *paymentsService, results [][]opResult, fig *crashFigures) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	balances := map[uuid.UUID]int64{}
	var id uuid.UUID
	var balance int64
	rows, _ := conn.Query(ctx, "SELECT id, balance FROM accounts")
	if _, err := pgx.ForEachRow(rows, []any{&id, &balance}, func() error {
		balances[id] = balance
		return nil
	}); err != nil {
		return err
	}
	payments := map[uuid.UUID]paymentRow{}
	var pr paymentRow
	rows, _ = conn.Query(ctx, "SELECT id, account_id, amount, coalesce(processor_id, ''), created_at FROM payments")
	if _, err := pgx.ForEachRow(rows, []any{&id, &pr.account, &pr.amount, &pr.processorID, &pr.created}, func() error {
		payments[id] = pr
		return nil
	}); err != nil {
		return err
	}
	keyRows := map[scopedKey]string{}
	var k scopedKey
	var status string
	rows, _ = conn.Query(ctx, "SELECT scope, idempotency_key, status FROM idempotency_keys")
	if _, err := pgx.ForEachRow(rows, []any{&k.scope, &k.key, &status}, func() error {
		keyRows[k] = status
		fig.keysByStatus[status]++
		return nil
	}); err != nil {
		return err
	}
	jobs := map[string]int{}
	if s.procURL != "" {
		var n int
		rows, _ = conn.Query(ctx, "SELECT state, count(*) FROM river_job WHERE kind = 'settle_payment' GROUP BY state")
		if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
			jobs[status] = n
			return nil
		}); err != nil {
			return err
		}
	}

	// The answers by key, in the order the clients got them.
	answers := map[opKey][]*opResult{}
	var order []opKey
	for _, rs := range results {
		for i := range rs {
			r := &rs[i]
			if r.err != "" {
				continue
			}
			if _, ok := answers[r.opKey]; !ok {
				order = append(order, r.opKey)
			}
			answers[r.opKey] = append(answers[r.opKey], r)
		}
	}

	// The payment each key's first 201 answered, and the balance answered
	// with each payment (its first key's).
	answered := map[opKey]*payment{}
	answeredBalance := map[uuid.UUID]int64{}
	for _, key := range order {
		first := answers[key][0]
		if first.status != http.StatusCreated {
			continue
		}
		var p payment
		dec := json.NewDecoder(bytes.NewReader(first.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			fig.violate("%s: undecodable payment %s: %v", key, bytes.TrimSpace(first.body), err)
			continue
		}
		answered[key] = &p
		if _, ok := answeredBalance[p.ID]; !ok {
			answeredBalance[p.ID] = p.Balance
		}
	}

	// Each account's payments in the order its charges committed: the
	// balance after each, and the total.
	owner := map[uuid.UUID]payAccount{}
	for _, acc := range s.principals {
		owner[acc.id] = acc
	}
	charges := map[uuid.UUID][]uuid.UUID{} // account -> its payments
	for _, id := range sortedIDs(payments) {
		p := payments[id]
		if _, ok := owner[p.account]; !ok {
			fig.violate("payment %s on account %s, which no principal of the run owns", id, p.account)
			continue
		}
		charges[p.account] = append(charges[p.account], id)
	}
	after := map[uuid.UUID]int64{}
	spent := map[uuid.UUID]int64{}
	for _, account := range sortedIDs(charges) {
		ids := charges[account]
		slices.SortStableFunc(ids, chargeOrder(payments, answeredBalance))
		for _, id := range ids {
			spent[account] += payments[id].amount
			after[id] = owner[account].start - spent[account]
			if after[id] < 0 {
				fig.violate("account %s: balance %d after payment %s", account, after[id], id)
			}
		}
	}

	var paid, refused, paidAnswers, refusedAnswers, lastReplayed int
	answeredFor := map[uuid.UUID][]opKey{} // payment id -> keys answered with it
	sent := map[scopedKey]bool{}
	for _, key := range order {
		acc := s.principals[key.principal-1]
		got := answers[key]
		first := got[0]
		sent[scopedKey{acc.scope(), key.key}] = true
		for _, r := range got[1:] {
			if r.status != first.status || !bytes.Equal(r.body, first.body) {
				fig.violate("%s: answered %d %s, then %d %s", key, first.status, bytes.TrimSpace(first.body), r.status, bytes.TrimSpace(r.body))
			}
		}
		if s.replays != nil {
			switch last, ok := s.replays[key]; {
			case !ok:
				fig.violate("%s: not sent again at the end", key)
			case last.err != "":
				fig.violate("%s: the last replay was never answered: %s", key, last.err)
			case last.status != first.status || !bytes.Equal(last.body, first.body):
				fig.violate("%s: the last replay answered %d %s, the client got %d %s", key, last.status, bytes.TrimSpace(last.body), first.status, bytes.TrimSpace(first.body))
			case !last.replayed:
				fig.violate("%s: the last replay ran the payment again", key)
			default:
				lastReplayed++
			}
		}
		wantRow := "completed"
		switch first.status {
		case http.StatusCreated:
			paid++
			paidAnswers += len(got)
			p := answered[key]
			if p == nil {
				break // undecodable, reported above
			}
			answeredFor[p.ID] = append(answeredFor[p.ID], key)
			row, ok := payments[p.ID]
			switch {
			case p.AccountID != acc.id || p.Amount != payAmountOf(key.key):
				fig.violate("%s: answered payment %+v, asked for %d on account %s", key, *p, payAmountOf(key.key), acc.id)
			case !ok:
				fig.violate("%s: answered payment %s, which is not in the database", key, p.ID)
			case row.account != p.AccountID || row.amount != p.Amount:
				fig.violate("%s: answered payment %+v, the database holds %d on account %s", key, *p, row.amount, row.account)
			case p.Balance != after[p.ID]:
				fig.violate("%s: answered balance %d, the balance right after payment %s was %d", key, p.Balance, p.ID, after[p.ID])
			}
		case http.StatusPaymentRequired:
			wantRow = "refused"
			refused++
			refusedAnswers += len(got)
			var problem struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(first.body, &problem); err != nil || problem.Type != problemInsufficientFunds {
				fig.violate("%s: 402 %s, not the insufficient-funds problem", key, bytes.TrimSpace(first.body))
			}
			if final := balances[acc.id]; final >= payAmountOf(key.key) {
				fig.violate("%s: refused for insufficient funds, but account %s still holds %d for %d", key, acc.id, final, payAmountOf(key.key))
			}
		}
		if st, ok := keyRows[scopedKey{acc.scope(), key.key}]; !ok {
			fig.violate("%s: answered %d, no key row in scope %s", key, first.status, acc.scope())
		} else if st != wantRow {
			fig.violate("%s: answered %d, key row %s", key, first.status, st)
		}
	}
	for _, id := range sortedIDs(payments) {
		switch keys := answeredFor[id]; len(keys) {
		case 1:
		case 0:
			fig.violate("payment %s (account %s, %d) that no client was answered", id, payments[id].account, payments[id].amount)
		default:
			fig.violate("payment %s answered to %d keys: %v", id, len(keys), keys)
		}
	}
	for k, st := range keyRows {
		if !sent[k] && st != "in_progress" {
			fig.violate("key row %q in scope %q (%s) that no client was answered", k.key, k.scope, st)
		}
	}
	if n := fig.keysByStatus["in_progress"]; n > 0 {
		fig.violate("%d keys left in_progress", n)
	}
	var low payAccount
	lowFinal := int64(-1)
	for _, acc := range s.principals {
		b, ok := balances[acc.id]
		switch {
		case !ok:
			fig.violate("account %s is gone", acc.id)
		case b != acc.start-spent[acc.id]:
			fig.violate("account %s: balance %d, opening balance %d less its payments %d is %d", acc.id, b, acc.start, spent[acc.id], acc.start-spent[acc.id])
		case b < 0:
			fig.violate("account %s: balance %d", acc.id, b)
		}
		if acc.low {
			low, lowFinal = acc, b
		}
	}

	fig.keys = len(answers)
	fig.rows = append(fig.rows,
		figure{"distinct keys answered", len(answers)},
		figure{"  201 payment made (answers, replays included)", fmt.Sprintf("%d (%d)", paid, paidAnswers)},
		figure{"  402 refused, insufficient funds (answers, replays included)", fmt.Sprintf("%d (%d)", refused, refusedAnswers)},
		figure{"payment rows", len(payments)})
	fig.rows = append(fig.rows, fig.keyRows()...)
	fig.rows = append(fig.rows,
		figure{"accounts checked", len(s.principals)},
		figure{"  the low account: opening / final balance", fmt.Sprintf("%d / %d", low.start, lowFinal)},
		figure{"keys sent again at the end, replayed equal", fmt.Sprintf("%d of %d (in %v)", lastReplayed, len(answers), s.replayTook.Round(100*time.Millisecond))})
	fig.ok = "every payment answered, each 201 committed exactly once with the answer and balance every client got, each 402 stored with no payment, balances exact, no key in progress, every key replayed at the end"

	if s.procURL != "" {
		checkSettlement(fig, s, payments, answeredFor, jobs)
	}
	return nil
}

// chargeOrder orders one account's payments as its charges committed, as
// far as the database and the answers tell. The ids are random and
// created_at is the start of the payment's transaction, which may have
// waited for the account's row behind a later one: neither is the order
// of the charges. The balances answered are: each charge lowers the
// balance, so the payments answered come first, by the balance answered,
// highest first. Any balance that does not fit that order (two charges
// that spent the same money, say) then differs from the one computed for
// its place. Payments no client was answered, a violation of their own,
// come after them in the order their transactions began.
func chargeOrder(payments map[uuid.UUID]paymentRow, answeredBalance map[uuid.UUID]int64) func(a, b uuid.UUID) int {
	return func(a, b uuid.UUID) int {
		ba, okA := answeredBalance[a]
		bb, okB := answeredBalance[b]
		switch {
		case okA && okB:
			return cmp.Compare(bb, ba)
		case okA:
			return -1
		case okB:
			return 1
		}
		return cmp.Or(payments[a].created.Compare(payments[b].created), bytes.Compare(a[:], b[:]))
	}
}

// settlePurpose is what the payments service derives the processor's key
// of a payment's charge for, from the key of the request that made it.
func settlePurpose(payment uuid.UUID) string { return "payments/settle/" + payment.String() }

// checkSettlement checks the processor's charges against the payments.
func checkSettlement(fig *crashFigures, s *paymentsService, payments map[uuid.UUID]paymentRow, answeredFor map[uuid.UUID][]opKey, jobs map[string]int) {
	if s.settleErr != nil {
		fig.violate("settlement: %v", s.settleErr)
	}
	perPayment := map[uuid.UUID]int{}
	for _, ch := range s.charges {
		perPayment[ch.PaymentID]++
		row, ok := payments[ch.PaymentID]
		if !ok {
			fig.violate("processor charge %s for payment %s, which did not commit", ch.ID, ch.PaymentID)
			continue
		}
		if row.processorID != ch.ID {
			fig.violate("payment %s records charge %q, the processor charged %s", ch.PaymentID, row.processorID, ch.ID)
		}
		if ch.AccountID != row.account || ch.Amount != row.amount || ch.Currency != "USD" {
			fig.violate("processor charge %s: %d %s on account %s for payment %s of %d on account %s",
				ch.ID, ch.Amount, ch.Currency, ch.AccountID, ch.PaymentID, row.amount, row.account)
		}
		if keys := answeredFor[ch.PaymentID]; len(keys) == 1 {
			acc := s.principals[keys[0].principal-1]
			want := idem.CallKey{Scope: acc.scope(), Key: keys[0].key}.Derive(settlePurpose(ch.PaymentID))
			if ch.Key != want {
				fig.violate("processor charge %s for payment %s under key %s, want %s (derived from %s)", ch.ID, ch.PaymentID, ch.Key, want, keys[0])
			}
		}
	}
	unsettled := 0
	for _, id := range sortedIDs(payments) {
		if payments[id].processorID == "" {
			unsettled++
		}
		if n := perPayment[id]; n != 1 {
			fig.violate("payment %s charged %d times at the processor", id, n)
		}
	}
	if s.procStats.Rejected != 0 {
		fig.violate("the processor rejected %d calls (a key reused for another charge, or a malformed charge)", s.procStats.Rejected)
	}
	total := 0
	for _, n := range jobs {
		total += n
	}
	if total != len(payments) || jobs["completed"] != total {
		fig.violate("settlement jobs by state %v, want %d completed", jobs, len(payments))
	}
	fig.rows = append(fig.rows,
		figure{"payments settled (processor charge recorded)", fmt.Sprintf("%d of %d", len(payments)-unsettled, len(payments))},
		figure{"processor charges", len(s.charges)},
		figure{"processor calls: charged / replayed / failed 503 / answer lost / rejected",
			fmt.Sprintf("%d / %d / %d / %d / %d", s.procStats.Charges, s.procStats.Replays, s.procStats.Failed, s.procStats.Lost, s.procStats.Rejected)},
		figure{"settlement jobs completed", fmt.Sprintf("%d of %d", jobs["completed"], total)},
		figure{"every payment settled, after the last answer", s.settled.Round(100 * time.Millisecond)})
	fig.ok += ", every payment settled by exactly one processor charge under its derived key"
}
