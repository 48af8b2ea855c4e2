package main

import (
	"bytes"
	"net/http"
	"os"
	"testing"

	"github.com/idemhq/idem/payments_example/internal/callmetrics"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// TestPlay runs the demo, both halves, on a shorter plan, with the service
// built and run as a child process and killed once: with idem every lost
// answer is replayed, the balance is exact and the processor charges each
// payment once, all settled within the bound; every synchronous charge
// that began is finished (those whose clients gave up, by the completer)
// and charged at the processor exactly once; every deposit of the stream
// is credited exactly once, through the kill and the second publishes;
// and the restarted service's metrics count the replays the proxy relayed
// from it and the duplicate deposits its consumer dropped; without it lost
// answers become duplicate charges, in the service and at the processor,
// and second publishes duplicate credits.
// Every request the demo sends the service, and every answer, is checked
// against the spec.
func TestPlay(t *testing.T) {
	if os.Getenv("IDEM_TEST_LONG") != "1" {
		t.Skip("a crash test: make test-long runs it (IDEM_TEST_LONG=1)")
	}
	// The kill meets deposits in the service's hands every run, not most:
	// the assertions on them below need it.
	holdAtKill = true
	spec := spectest.New(t)
	wrap := func(rt http.RoundTripper) http.RoundTripper { return spec.Transport(t, rt) }
	var out bytes.Buffer
	with, without, naive, err := run(t.Context(), &out, makePlan()[:60], makeChargePlan()[:30], makeDepositPlan()[:40], wrap)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !with.exact() || with.lost == 0 || with.replays < with.lost || with.retries < with.lost {
		t.Fatalf("with idem: %+v; want exact, some lost answers, and a replay for each", with)
	}
	// The charges: every one that began was finished, and charged at the
	// processor exactly once; those whose clients gave up by the
	// completer alone.
	if c := with.sync; !c.exact() || c.gaveUp == 0 || c.byCompleter == 0 || c.begun < c.sent-c.gaveUp ||
		c.processorDuplicates() != 0 || c.duplicates() != 0 || c.unfinished != 0 {
		t.Fatalf("charges: %+v; want exact, no duplicate, nothing unfinished, and some finished by the completer", c)
	}
	// The deposits: each credited once, none lost, though the kill met
	// some in the service's hands; without idem, the second publishes
	// are credited again.
	if d := with.deposits; !d.exact() || d.inHand == 0 || d.republished == 0 || d.redeliveries == 0 {
		t.Fatalf("deposits: %+v; want exact, some in hand at the kill, redelivered, and some published twice", d)
	}
	if d := without.deposits; d.duplicates < d.republished || d.lost != 0 {
		t.Fatalf("deposits without idem: %+v; want a duplicate credit for each second publish, none lost", d)
	}
	// The restarted service's metrics: it executed payments, and counted
	// as replays exactly the replays the proxy relayed from it.
	if callmetrics.Of(with.metrics, "executed") == 0 || !with.metricsAgree() {
		t.Fatalf("with idem: metrics %+v after the restart, %d replays relayed from it; want executed calls and the same replays",
			with.metrics, with.replaysSinceRestart)
	}
	// A lost 201 becomes a second payment; a lost 503 (the processor
	// failed, the payment rolled back) costs nothing; a lost answer of the
	// processor is a charge without a payment.
	if without.duplicates() <= 0 || without.lost == 0 || without.replays != 0 || without.actual >= without.expected {
		t.Fatalf("without idem: %+v; want duplicate charges, no replay, a balance under %d", without, without.expected)
	}
	// A new key per attempt turns the lost answers into duplicates, idem
	// or not.
	if naive.duplicates() <= 0 || naive.replays != 0 {
		t.Fatalf("naive client: %+v; want duplicate charges and no replay", naive)
	}
	if without.processorDuplicates() <= without.duplicates() {
		t.Fatalf("without idem: %+v; want more duplicates at the processor than in the service", without)
	}
}
