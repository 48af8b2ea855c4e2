// Package callmetrics reads the count of idem's calls from the payments
// service's GET /metrics: the idem_calls_total series of the exposition,
// summed by outcome and HTTP status; and, with Sum, any counter of it by
// one label, such as the deposits consumer's deliveries. The demo prints
// them; the tests check them.
package callmetrics

import (
	"cmp"
	"fmt"
	"io"
	"slices"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The names of the series and labels read, as the OpenTelemetry
// Prometheus exporter gives them to idemotel's idem.calls, idem.outcome,
// http.response.status_code and idem.resume.
const (
	Metric      = "idem_calls_total"
	OutcomeName = "idem_outcome"
	StatusName  = "http_response_status_code"
	ResumeName  = "idem_resume"
)

// The names of the deposits consumer's counters, as the exporter gives the
// service's deposits.messages (by deposits.result) and
// deposits.redeliveries.
const (
	DepositsMetric     = "deposits_messages_total"
	DepositsResultName = "deposits_result"
	RedeliveriesMetric = "deposits_redeliveries_total"
)

// A Count is how many calls ended with an outcome and an HTTP status.
type Count struct {
	Outcome string // "executed", "replayed", "in_progress", ... (idem.Outcome.String)
	Status  string // the HTTP status answered; "" when there was none
	// Resume marks the calls of idem.Operation.Resume: the completer's,
	// not a client's.
	Resume bool
	N      int64
}

// outcomes orders the outcomes as idem.Outcome does.
var outcomes = []string{"executed", "replayed", "refused", "in_progress", "mismatch", "failed", "outcome_unknown", "invalid"}

// Read parses a Prometheus text exposition and returns its idem calls
// summed by outcome and status (over tables, operations, error types and
// whatever else they are labelled with), ordered by outcome then status.
// An exposition without the metric has no counts.
func Read(r io.Reader) ([]Count, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("callmetrics: %w", err)
	}
	type key struct {
		outcome, status string
		resume          bool
	}
	sums := map[key]float64{}
	if f := families[Metric]; f != nil {
		for _, m := range f.GetMetric() {
			var k key
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case OutcomeName:
					k.outcome = l.GetValue()
				case StatusName:
					k.status = l.GetValue()
				case ResumeName:
					k.resume = l.GetValue() == "true"
				}
			}
			sums[k] += m.GetCounter().GetValue()
		}
	}
	counts := make([]Count, 0, len(sums))
	for k, v := range sums {
		counts = append(counts, Count{Outcome: k.outcome, Status: k.status, Resume: k.resume, N: int64(v)})
	}
	slices.SortFunc(counts, func(a, b Count) int {
		return cmp.Or(cmp.Compare(rank(a.Outcome), rank(b.Outcome)), cmp.Compare(a.Outcome, b.Outcome),
			cmp.Compare(a.Status, b.Status), boolCompare(a.Resume, b.Resume))
	})
	return counts, nil
}

// Sum parses a Prometheus text exposition and returns the counter metric
// summed by the value of its label ("" for series without it). An
// exposition without the metric has no sums.
func Sum(r io.Reader, metric, label string) (map[string]int64, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("callmetrics: %w", err)
	}
	sums := map[string]float64{}
	if f := families[metric]; f != nil {
		for _, m := range f.GetMetric() {
			value := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					value = l.GetValue()
				}
			}
			sums[value] += m.GetCounter().GetValue()
		}
	}
	out := make(map[string]int64, len(sums))
	for k, v := range sums {
		out[k] = int64(v)
	}
	return out, nil
}

// rank places the known outcomes first, in idem's order.
func rank(outcome string) int {
	if i := slices.Index(outcomes, outcome); i >= 0 {
		return i
	}
	return len(outcomes)
}

// Of returns the clients' calls of counts with outcome, whatever their
// status: the completer's (Resume) are left out.
func Of(counts []Count, outcome string) int64 {
	var n int64
	for _, c := range counts {
		if c.Outcome == outcome && !c.Resume {
			n += c.N
		}
	}
	return n
}

// boolCompare orders false before true.
func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
