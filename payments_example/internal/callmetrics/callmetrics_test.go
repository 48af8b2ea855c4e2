package callmetrics_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/idemhq/idem/payments_example/internal/callmetrics"
)

// TestRead sums idem_calls_total over the labels other than outcome and
// status, orders the counts by idem's outcomes, and ignores other metrics.
func TestRead(t *testing.T) {
	const text = `# HELP idem_calls_total Calls.
# TYPE idem_calls_total counter
idem_calls_total{http_response_status_code="201",idem_outcome="replayed",idem_refused="false",idem_table="idempotency_keys",otel_scope_name="x"} 2
idem_calls_total{http_response_status_code="409",error_type="idem.ErrInProgress",idem_outcome="in_progress",idem_refused="false",idem_table="idempotency_keys",otel_scope_name="x"} 1
idem_calls_total{http_response_status_code="201",idem_outcome="executed",idem_refused="false",idem_table="idempotency_keys",otel_scope_name="x"} 5
idem_calls_total{http_response_status_code="201",idem_outcome="executed",idem_refused="false",idem_table="other_keys",otel_scope_name="x"} 1
idem_calls_total{http_response_status_code="402",idem_outcome="refused",idem_refused="true",idem_table="idempotency_keys",otel_scope_name="x"} 3
idem_calls_total{idem_operation="charge",idem_outcome="replayed",idem_refused="false",idem_resume="true",idem_table="idempotency_keys",otel_scope_name="x"} 4
# HELP idem_key_count Keys.
# TYPE idem_key_count gauge
idem_key_count{idem_key_state="expired",idem_table="idempotency_keys"} 7
`
	got, err := callmetrics.Read(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []callmetrics.Count{
		{Outcome: "executed", Status: "201", N: 6},
		{Outcome: "replayed", Status: "", Resume: true, N: 4},
		{Outcome: "replayed", Status: "201", N: 2},
		{Outcome: "refused", Status: "402", N: 3},
		{Outcome: "in_progress", Status: "409", N: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Read = %+v, want %+v", got, want)
	}
	if n := callmetrics.Of(got, "executed"); n != 6 {
		t.Errorf("Of(executed) = %d, want 6", n)
	}
	if n := callmetrics.Of(got, "replayed"); n != 2 {
		t.Errorf("Of(replayed) = %d, want 2: the completer's Resume calls are not a client's replays", n)
	}
	if got, err := callmetrics.Read(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Errorf("Read(empty) = %v, %v; want no counts", got, err)
	}
	if _, err := callmetrics.Read(strings.NewReader("idem_calls_total{ 1\n")); err == nil {
		t.Error("Read of a malformed exposition: no error")
	}
}

// TestSum sums a counter by one label over the others, and ignores other
// metrics.
func TestSum(t *testing.T) {
	const text = `# HELP deposits_messages_total Deliveries.
# TYPE deposits_messages_total counter
deposits_messages_total{deposits_result="credited",otel_scope_name="x"} 5
deposits_messages_total{deposits_result="duplicate",otel_scope_name="x"} 2
deposits_messages_total{deposits_result="duplicate",otel_scope_name="y"} 1
# HELP deposits_redeliveries_total Redeliveries.
# TYPE deposits_redeliveries_total counter
deposits_redeliveries_total{otel_scope_name="x"} 4
`
	got, err := callmetrics.Sum(strings.NewReader(text), callmetrics.DepositsMetric, callmetrics.DepositsResultName)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"credited": 5, "duplicate": 3}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Sum by result = %v, want %v", got, want)
	}
	got, err = callmetrics.Sum(strings.NewReader(text), callmetrics.RedeliveriesMetric, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"": 4}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Sum of redeliveries = %v, want %v", got, want)
	}
	if got, err := callmetrics.Sum(strings.NewReader(""), callmetrics.DepositsMetric, callmetrics.DepositsResultName); err != nil || len(got) != 0 {
		t.Errorf("Sum(empty) = %v, %v; want no sums", got, err)
	}
}
