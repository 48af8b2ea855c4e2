package main

import (
	"os"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/testdb"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/spectest"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// TestPlay runs both halves of the demo on a shorter plan: with idem every
// lost answer is replayed and the balance is exact; without it every lost
// answer becomes a duplicate charge. Every request the generated client
// sends, and every answer, first or replayed, is checked against the spec
// on the service's side.
func TestPlay(t *testing.T) {
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	protected, err := payments.NewHandler(pool, keys, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := spectest.New(t)
	plan := makePlan()[:60]

	with, err := play(t.Context(), pool, spec.Handler(t, protected), plan)
	if err != nil {
		t.Fatal(err)
	}
	if !with.exact() || with.lost == 0 || with.retries != with.lost || with.replays != with.lost {
		t.Fatalf("with idem: %+v; want an exact balance, some lost answers, and a replay for each", with)
	}

	without, err := play(t.Context(), pool, spec.Handler(t, payments.NewUnprotectedHandler(pool, nil, nil)), plan)
	if err != nil {
		t.Fatal(err)
	}
	if without.lost != with.lost || without.duplicates() != int(without.lost) || without.replays != 0 {
		t.Fatalf("without idem: %+v; want one duplicate charge per lost answer (%d)", without, with.lost)
	}
	if without.actual >= without.expected {
		t.Fatalf("without idem: balance %d, want less than %d", without.actual, without.expected)
	}
}
