package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

// payFixture is a payments database (the example's own schema, read from
// its file, and River's job table reduced to what the reconciliation
// reads) with three accounts: principal 1 low (100), principals 2 and 3
// rich (1,000,000); and the answers the clients got.
type payFixture struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	s       *paymentsService
	results []opResult
	records []faultRecord
}

func newPayFixture(t *testing.T) *payFixture {
	t.Helper()
	ctx := context.Background()
	pool := testdb.New(t)
	schema, err := os.ReadFile("../../payments_example/internal/payments/sql/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(schema)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE river_job (id bigserial PRIMARY KEY, kind text NOT NULL, state text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	f := &payFixture{t: t, ctx: ctx, pool: pool, s: &paymentsService{accounts: 3, replays: map[opKey]opResult{}}}
	for i, start := range []int64{100, 1_000_000, 1_000_000} {
		acc := payAccount{id: f.newAccount(start), start: start, low: i == 0}
		f.s.principals = append(f.s.principals, acc)
	}
	return f
}

// newAccount opens an account holding balance, as the service does (a
// random id, the hash of an API key of its own), and returns its id.
func (f *payFixture) newAccount(balance int64) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	apiKeyHash := sha256.Sum256([]byte("sk_" + id.String()))
	f.exec("INSERT INTO accounts (id, owner, balance, api_key_sha256) VALUES ($1, 't', $2, $3)", id, balance, apiKeyHash[:])
	return id
}

func (f *payFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *payFixture) account(principal int) payAccount { return f.s.principals[principal-1] }

// charge commits a payment of amount on principal's account, as the
// service does (a random id), and returns its id and the balance right
// after it.
func (f *payFixture) charge(principal int, amount int64) (id uuid.UUID, balance int64) {
	f.t.Helper()
	return f.chargeAs(uuid.New(), principal, amount)
}

// chargeAs is charge with the payment's id given.
func (f *payFixture) chargeAs(payment uuid.UUID, principal int, amount int64) (id uuid.UUID, balance int64) {
	f.t.Helper()
	acc := f.account(principal)
	if err := f.pool.QueryRow(f.ctx, "UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance", acc.id, amount).Scan(&balance); err != nil {
		f.t.Fatal(err)
	}
	if err := f.pool.QueryRow(f.ctx, "INSERT INTO payments (id, account_id, amount, currency) VALUES ($1, $2, $3, 'USD') RETURNING id",
		payment, acc.id, amount).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	return id, balance
}

// keyRow stores key's row in principal's scope (principal 0: no scope).
func (f *payFixture) keyRow(principal int, key, status string) {
	f.t.Helper()
	scope := ""
	if principal > 0 {
		scope = f.account(principal).scope()
	}
	f.exec(`INSERT INTO idempotency_keys (scope, idempotency_key, request_hash, status, expires_at)
		VALUES ($1, $2, 'h', $3, now() + interval '1 hour')`, scope, key, status)
}

// answer records that a client got status and body for key, and, unless
// lastReplay is false, that the end's replay of it got the same.
func (f *payFixture) answer(class string, principal int, key string, status int, body string, replayed, lastReplay bool) opKey {
	k := opKey{principal: principal, key: key}
	now := time.Now().Add(-time.Second)
	f.results = append(f.results, opResult{class: class, opKey: k, status: status, body: []byte(body), replayed: replayed,
		attempts: 1, start: now, lastStart: now, end: now})
	if lastReplay {
		f.s.replays[k] = opResult{class: "last replay", opKey: k, status: status, body: []byte(body), replayed: true, attempts: 1}
	}
	return k
}

// paid makes a payment for key as the service would (the charge, the key
// row, the client's answer and the end's replay) and returns its id.
func (f *payFixture) paid(principal int, key string) uuid.UUID {
	f.t.Helper()
	id, balance := f.charge(principal, payAmountOf(key))
	f.keyRow(principal, key, "completed")
	f.answer(classFresh, principal, key, 201, f.paymentBody(principal, key, id, balance), false, true)
	return id
}

func (f *payFixture) paymentBody(principal int, key string, id uuid.UUID, balance int64) string {
	return fmt.Sprintf(`{"account_id":%q,"amount":%d,"balance":%d,"id":%q}`+"\n", f.account(principal).id.String(), payAmountOf(key), balance, id.String())
}

const refusalBody = `{"type":"/problems/payments/insufficient-funds","title":"Insufficient funds","status":402,"detail":"the balance does not cover the amount"}` + "\n"

// refused stores a refusal for key as the service would.
func (f *payFixture) refused(principal int, key string) {
	f.keyRow(principal, key, "refused")
	f.answer(classFresh, principal, key, 402, refusalBody, false, true)
}

// check reconciles and fails the test unless a violation contains each
// of want.
func (f *payFixture) check(want ...string) {
	f.t.Helper()
	violations := f.violations()
	if len(violations) > 20 {
		f.t.Fatalf("more violations than are listed; split the case: %v", violations)
	}
	all := strings.Join(violations, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			f.t.Errorf("no violation mentions %q; got:\n%s", w, all)
		}
	}
}

// violations reconciles and returns the violations found.
func (f *payFixture) violations() []string {
	f.t.Helper()
	fig := tally([][]opResult{f.results}, f.records, len(f.records))
	if err := reconcilePayments(f.ctx, f.pool.Config().ConnString(), f.s, [][]opResult{f.results}, fig); err != nil {
		f.t.Fatal(err)
	}
	return fig.violations
}

// TestReconcilePaymentsFindsViolations feeds the payments reconciliation a
// database and answers that break each invariant, and checks that it names
// every break.
func TestReconcilePaymentsFindsViolations(t *testing.T) {
	t.Run("clean", func(t *testing.T) {
		// What a run without faults leaves, settled: the same key paid on
		// two accounts (scopes), a refusal on the low account (100 cannot
		// cover it), a retry replayed.
		f := newPayFixture(t)
		f.s.procURL = "http://processor"
		for _, p := range []int{2, 3} {
			id := f.paid(p, "k1")
			acc := f.account(p)
			f.exec("UPDATE payments SET processor_id = $2 WHERE id = $1", id, fmt.Sprint("ch-", id))
			f.exec("INSERT INTO river_job (kind, state) VALUES ('settle_payment', 'completed')")
			f.s.charges = append(f.s.charges, fakeCharge{ID: fmt.Sprint("ch-", id),
				Key:       idem.CallKey{Scope: acc.scope(), Key: "k1"}.Derive("payments/settle/" + id.String()),
				PaymentID: id, AccountID: acc.id, Amount: payAmountOf("k1"), Currency: "USD"})
		}
		f.answer(classRetry, 3, "k1", 201, string(f.results[1].body), true, false)
		f.refused(1, "k-big")
		f.answer(classRetry, 1, "k-big", 402, refusalBody, true, false)
		fig := tally([][]opResult{f.results}, nil, 0)
		if err := reconcilePayments(f.ctx, f.pool.Config().ConnString(), f.s, [][]opResult{f.results}, fig); err != nil {
			t.Fatal(err)
		}
		if len(fig.violations) != 0 {
			t.Fatalf("violations in a clean run: %v", fig.violations)
		}
	})

	t.Run("answers", func(t *testing.T) {
		f := newPayFixture(t)
		// k-stuck was never answered and left its key in progress; a
		// retry of k-ok ran again; k-differ was answered two ways; the
		// end's replay of k-gone never happened, of k-lastdiff differed,
		// of k-lastran ran the payment again.
		f.results = append(f.results, opResult{class: classFresh, opKey: opKey{principal: 2, key: "k-stuck"}, attempts: 3, err: "gave up after 3 attempts"})
		f.keyRow(2, "k-stuck", "in_progress")
		f.paid(2, "k-ok")
		f.answer(classRetry, 2, "k-ok", 201, string(f.results[len(f.results)-1].body), false, true)
		f.paid(2, "k-differ")
		f.answer(classRetry, 2, "k-differ", 402, refusalBody, true, false)
		id, balance := f.charge(2, payAmountOf("k-gone"))
		f.keyRow(2, "k-gone", "completed")
		f.answer(classFresh, 2, "k-gone", 201, f.paymentBody(2, "k-gone", id, balance), false, false)
		f.paid(2, "k-lastdiff")
		f.s.replays[opKey{2, "k-lastdiff"}] = opResult{status: 402, body: []byte(refusalBody), replayed: true}
		f.paid(2, "k-lastran")
		last := f.s.replays[opKey{2, "k-lastran"}]
		last.replayed = false
		f.s.replays[opKey{2, "k-lastran"}] = last
		f.check(
			"key k-stuck of principal 2: never answered",
			"1 keys left in_progress",
			"key k-ok of principal 2: a retry of a key already answered ran the operation again",
			"key k-differ of principal 2: answered 201",
			"key k-gone of principal 2: not sent again at the end",
			"key k-lastdiff of principal 2: the last replay answered 402",
			"key k-lastran of principal 2: the last replay ran the payment again",
		)
	})

	t.Run("payments", func(t *testing.T) {
		f := newPayFixture(t)
		// k-lost was answered a payment that is not there; k-asked a
		// payment of another amount; k-held one whose row holds another
		// amount; k-balance the wrong balance; k-twin-a and k-twin-b the
		// same payment; a payment no one was answered; principal 1 (100)
		// charged beyond its balance by payments no one was answered.
		lost := uuid.New()
		f.keyRow(2, "k-lost", "completed")
		f.answer(classFresh, 2, "k-lost", 201, f.paymentBody(2, "k-lost", lost, 1), false, true)
		asked, balance := f.charge(2, payAmountOf("k-asked"))
		f.keyRow(2, "k-asked", "completed")
		f.answer(classFresh, 2, "k-asked", 201, fmt.Sprintf(`{"account_id":%q,"amount":%d,"balance":%d,"id":%q}`,
			f.account(2).id.String(), payAmountOf("k-asked")+1, balance, asked.String()), false, true)
		held, balance := f.charge(2, payAmountOf("k-held")+1)
		f.keyRow(2, "k-held", "completed")
		f.answer(classFresh, 2, "k-held", 201, f.paymentBody(2, "k-held", held, balance), false, true)
		id, balance := f.charge(2, payAmountOf("k-balance"))
		f.keyRow(2, "k-balance", "completed")
		f.answer(classFresh, 2, "k-balance", 201, f.paymentBody(2, "k-balance", id, balance+7), false, true)
		twin, balance := f.charge(3, payAmountOf("k-twin"))
		for _, key := range []string{"k-twin-a", "k-twin-b"} {
			f.keyRow(3, key, "completed")
			f.answer(classFresh, 3, key, 201, f.paymentBody(3, "k-twin", twin, balance), false, true)
		}
		phantom, _ := f.charge(3, 5)
		f.exec("ALTER TABLE accounts DROP CONSTRAINT accounts_balance_check")
		over1, _ := f.charge(1, 60)
		over2, _ := f.charge(1, 60)
		f.check(
			fmt.Sprintf("key k-lost of principal 2: answered payment %s, which is not in the database", lost),
			fmt.Sprintf("key k-asked of principal 2: answered payment {ID:%s", asked),
			fmt.Sprintf("key k-held of principal 2: answered payment {ID:%s", held),
			"key k-balance of principal 2: answered balance",
			fmt.Sprintf("payment %s answered to 2 keys", twin),
			fmt.Sprintf("payment %s (account %s, 5) that no client was answered", phantom, f.account(3).id),
			fmt.Sprintf("payment %s (account %s, 60) that no client was answered", over1, f.account(1).id),
			fmt.Sprintf("account %s: balance -20 after payment %s", f.account(1).id, over2),
			fmt.Sprintf("account %s: balance -20", f.account(1).id),
		)
	})

	t.Run("charge order", func(t *testing.T) {
		// Principal 2's payments committed in the order k-o1, k-o2, k-o3,
		// but their ids, and the starts of their transactions, are in the
		// reverse order: the balances answered say the order, and every
		// one is right.
		f := newPayFixture(t)
		for i, key := range []string{"k-o1", "k-o2", "k-o3"} {
			id, balance := f.chargeAs(uuid.UUID{byte(0xf0 - 0x70*i)}, 2, payAmountOf(key))
			f.exec("UPDATE payments SET created_at = now() - make_interval(secs => $2) WHERE id = $1", id, i)
			f.keyRow(2, key, "completed")
			f.answer(classFresh, 2, key, 201, f.paymentBody(2, key, id, balance), false, true)
		}
		if v := f.violations(); len(v) != 0 {
			t.Fatalf("violations for charges answered in order: %v", v)
		}
	})

	t.Run("charge order violated", func(t *testing.T) {
		// k-x and k-y committed in that order, but k-x was answered the
		// balance after k-y and k-y the balance after k-x: no order of the
		// two charges gives both, though the final balance is right.
		f := newPayFixture(t)
		x, afterX := f.charge(3, payAmountOf("k-x"))
		y, afterY := f.charge(3, payAmountOf("k-y"))
		f.keyRow(3, "k-x", "completed")
		f.answer(classFresh, 3, "k-x", 201, f.paymentBody(3, "k-x", x, afterY), false, true)
		f.keyRow(3, "k-y", "completed")
		f.answer(classFresh, 3, "k-y", 201, f.paymentBody(3, "k-y", y, afterX), false, true)
		f.check(fmt.Sprintf("key k-y of principal 3: answered balance %d, the balance right after payment %s was %d", afterX, y, 1_000_000-payAmountOf("k-y")))
	})

	t.Run("balances and refusals", func(t *testing.T) {
		f := newPayFixture(t)
		// Principal 3's balance moved without a payment; principal 2
		// (rich) was refused; k-type was refused with another problem; a
		// payment on an account no principal owns.
		f.paid(3, "k-fine")
		f.exec("UPDATE accounts SET balance = balance + 1 WHERE id = $1", f.account(3).id)
		f.refused(2, "k-unjust")
		f.keyRow(1, "k-type", "refused")
		f.answer(classFresh, 1, "k-type", 402, `{"type":"about:blank","status":402}`, false, true)
		stranger := f.newAccount(0)
		f.exec("INSERT INTO payments (id, account_id, amount, currency) VALUES ($1, $2, 1, 'USD')", uuid.New(), stranger)
		f.check(
			fmt.Sprintf("account %s: balance %d, opening balance 1000000 less its payments", f.account(3).id, 1_000_000-payAmountOf("k-fine")+1),
			fmt.Sprintf("key k-unjust of principal 2: refused for insufficient funds, but account %s still holds 1000000", f.account(2).id),
			"key k-type of principal 1: 402 {\"type\":\"about:blank\",\"status\":402}, not the insufficient-funds problem",
			fmt.Sprintf("on account %s, which no principal of the run owns", stranger),
		)
	})

	t.Run("key rows", func(t *testing.T) {
		f := newPayFixture(t)
		// k-status committed with its key row refused; k-norow has no key
		// row, and k-unscoped's is outside its principal's scope; k-ghost
		// has a key row that no client sent.
		id, balance := f.charge(2, payAmountOf("k-status"))
		f.keyRow(2, "k-status", "refused")
		f.answer(classFresh, 2, "k-status", 201, f.paymentBody(2, "k-status", id, balance), false, true)
		id, balance = f.charge(2, payAmountOf("k-norow"))
		f.answer(classFresh, 2, "k-norow", 201, f.paymentBody(2, "k-norow", id, balance), false, true)
		id, balance = f.charge(2, payAmountOf("k-unscoped"))
		f.keyRow(0, "k-unscoped", "completed")
		f.answer(classFresh, 2, "k-unscoped", 201, f.paymentBody(2, "k-unscoped", id, balance), false, true)
		f.keyRow(3, "k-ghost", "completed")
		f.check(
			"key k-status of principal 2: answered 201, key row refused",
			fmt.Sprintf("key k-norow of principal 2: answered 201, no key row in scope account:%s", f.account(2).id),
			fmt.Sprintf("key k-unscoped of principal 2: answered 201, no key row in scope account:%s", f.account(2).id),
			`key row "k-unscoped" in scope "" (completed) that no client was answered`,
			fmt.Sprintf(`key row "k-ghost" in scope "account:%s" (completed) that no client was answered`, f.account(3).id),
		)
	})

	t.Run("faults", func(t *testing.T) {
		f := newPayFixture(t)
		f.paid(2, "k-fine")
		now := time.Now()
		f.records = []faultRecord{
			{fault: fault{kind: "db", percent: 30}, at: now, dead: now, up: now},
			{fault: fault{kind: "app", percent: 50}, at: now, dead: now, up: now, err: errors.New("restart failed")},
		}
		fig := tally([][]opResult{f.results}, f.records, 3)
		all := strings.Join(fig.violations, "\n")
		for _, w := range []string{"fault db@30: no operation was in flight", "fault app0@50: restart failed", "2 of 3 faults injected"} {
			if !strings.Contains(all, w) {
				t.Errorf("no violation mentions %q; got:\n%s", w, all)
			}
		}
	})

	t.Run("settlement", func(t *testing.T) {
		f := newPayFixture(t)
		// p-once is settled right; p-twice charged twice; p-none never
		// charged; p-otherkey charged under another key; p-recorded
		// records another charge than the processor made; p-amount
		// charged for another amount; a charge for a payment that did
		// not commit; a rejected call; a job not completed; the wait
		// timed out.
		f.s.procURL = "http://processor"
		f.s.settleErr = errors.New("3 payments not settled at the deadline")
		f.s.procStats.Rejected = 1
		charge := func(key string, id uuid.UUID, processorID string) fakeCharge {
			acc := f.account(2)
			return fakeCharge{ID: processorID, Key: idem.CallKey{Scope: acc.scope(), Key: key}.Derive("payments/settle/" + id.String()),
				PaymentID: id, AccountID: acc.id, Amount: payAmountOf(key), Currency: "USD"}
		}
		ids := map[string]uuid.UUID{}
		for _, key := range []string{"p-once", "p-twice", "p-none", "p-otherkey", "p-recorded", "p-amount"} {
			ids[key] = f.paid(2, key)
			f.exec("INSERT INTO river_job (kind, state) VALUES ('settle_payment', 'completed')")
			if key != "p-none" {
				f.exec("UPDATE payments SET processor_id = $2 WHERE id = $1", ids[key], "ch-"+key)
			}
		}
		f.exec("UPDATE river_job SET state = 'retryable' WHERE id = 1")
		otherKey := charge("p-otherkey", ids["p-otherkey"], "ch-p-otherkey")
		otherKey.Key = "not-derived"
		amount := charge("p-amount", ids["p-amount"], "ch-p-amount")
		amount.Amount++
		ghost := uuid.New()
		f.s.charges = []fakeCharge{
			charge("p-once", ids["p-once"], "ch-p-once"),
			charge("p-twice", ids["p-twice"], "ch-p-twice"),
			charge("p-twice", ids["p-twice"], "ch-p-twice"),
			otherKey,
			charge("p-recorded", ids["p-recorded"], "ch-elsewhere"),
			amount,
			{ID: "ch-ghost", PaymentID: ghost, AccountID: f.account(2).id, Amount: 1, Currency: "USD"},
		}
		f.check(
			"settlement: 3 payments not settled at the deadline",
			fmt.Sprintf("payment %s charged 2 times at the processor", ids["p-twice"]),
			fmt.Sprintf("payment %s charged 0 times at the processor", ids["p-none"]),
			fmt.Sprintf("processor charge ch-p-otherkey for payment %s under key not-derived", ids["p-otherkey"]),
			fmt.Sprintf(`payment %s records charge "ch-p-recorded", the processor charged ch-elsewhere`, ids["p-recorded"]),
			fmt.Sprintf("processor charge ch-p-amount: %d USD", payAmountOf("p-amount")+1),
			fmt.Sprintf("processor charge ch-ghost for payment %s, which did not commit", ghost),
			"the processor rejected 1 calls",
			"settlement jobs by state map[completed:5 retryable:1], want 6 completed",
		)
	})
}
