// Package callmetrics reads the count of idem's calls from the payments
// service's GET /metrics: the idem_calls_total series of the exposition,
// summed by outcome and HTTP status. The demo prints them; the tests check
// them.
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
// Prometheus exporter gives them to idemotel's idem.calls, idem.outcome
// and http.response.status_code.
const (
	Metric      = "idem_calls_total"
	OutcomeName = "idem_outcome"
	StatusName  = "http_response_status_code"
)

// A Count is how many calls ended with an outcome and an HTTP status.
type Count struct {
	Outcome string // "executed", "replayed", "in_progress", ... (idem.Outcome.String)
	Status  string // the HTTP status answered; "" when there was none
	N       int64
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
	sums := map[[2]string]float64{}
	if f := families[Metric]; f != nil {
		for _, m := range f.GetMetric() {
			var k [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case OutcomeName:
					k[0] = l.GetValue()
				case StatusName:
					k[1] = l.GetValue()
				}
			}
			sums[k] += m.GetCounter().GetValue()
		}
	}
	counts := make([]Count, 0, len(sums))
	for k, v := range sums {
		counts = append(counts, Count{Outcome: k[0], Status: k[1], N: int64(v)})
	}
	slices.SortFunc(counts, func(a, b Count) int {
		return cmp.Or(cmp.Compare(rank(a.Outcome), rank(b.Outcome)), cmp.Compare(a.Outcome, b.Outcome), cmp.Compare(a.Status, b.Status))
	})
	return counts, nil
}

// rank places the known outcomes first, in idem's order.
func rank(outcome string) int {
	if i := slices.Index(outcomes, outcome); i >= 0 {
		return i
	}
	return len(outcomes)
}

// Of returns the calls of counts with outcome, whatever their status.
func Of(counts []Count, outcome string) int64 {
	var n int64
	for _, c := range counts {
		if c.Outcome == outcome {
			n += c.N
		}
	}
	return n
}
