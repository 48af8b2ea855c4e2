package idemotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/testkit/holdkeys"
	"github.com/idemhq/idem/testkit/testdb"
)

// scrape serves the metrics of a MeterProvider on a Prometheus exporter
// with the given options, after some calls, an operation of one step and a
// held key, and returns the exposition text.
func scrape(t *testing.T, accept string, opts ...otelprom.Option) string {
	t.Helper()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(append([]otelprom.Option{otelprom.WithRegisterer(reg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })

	pool := testdb.New(t)
	keys, err := idem.NewClient(pool, &idem.Config{Observer: idemotel.New(idemotel.WithMeterProvider(mp))})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := idem.Do(ctx, keys, "k", "h", func(pgx.Tx) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
	}
	op, err := idem.NewOperation(keys, "charge", func(s *idem.Steps, n int) (int, error) {
		return idem.Step(s, "reserve", func(context.Context, pgx.Tx) (int, error) { return n, nil })
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := op.Run(ctx, "op", 1); err != nil {
		t.Fatal(err)
	}
	reg2, err := idemotel.RegisterStats(keys, idemotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg2.Unregister() })
	holdkeys.Hold(t, keys, "held", 1)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

var metricName = regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:.]*|"[^"]+")[{ ]`)

// names returns the idem metric names in an exposition, sorted.
func names(text string) []string {
	seen := map[string]bool{}
	for _, m := range metricName.FindAllStringSubmatch(text, -1) {
		if strings.Contains(m[1], "idem") {
			seen[m[1]] = true
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestPrometheusNames pins the names the OpenTelemetry Prometheus exporter
// gives idemotel's metrics, which dashboards (docs/grafana) query, with the
// translation the documentation recommends: UnderscoreEscapingWithSuffixes.
func TestPrometheusNames(t *testing.T) {
	// A Prometheus 3 server asks for UTF-8 names; the strategy keeps them
	// escaped all the same.
	text := scrape(t, utf8Accept, otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	t.Logf("exposition:\n%s", text)
	if got := strings.Join(names(text), " "); got != promNames {
		t.Fatalf("metric names\n got: %s\nwant: %s", got, promNames)
	}
	for _, series := range []string{
		`idem_calls_total{idem_outcome="executed",idem_refused="false",idem_table="idempotency_keys",`,
		`idem_calls_total{idem_outcome="replayed",idem_refused="false",idem_table="idempotency_keys",`,
		`idem_duration_seconds_bucket{idem_outcome="executed",idem_refused="false",idem_table="idempotency_keys",`,
		`idem_key_count{idem_key_state="in_progress",idem_table="idempotency_keys",`,
		`idem_key_count{idem_key_state="expired",idem_table="idempotency_keys",`,
		`idem_table_size_bytes{idem_table="idempotency_keys",`,
		`idem_step_duration_seconds_bucket{idem_operation="charge",idem_refused="false",idem_step="reserve",idem_step_kind="database",idem_step_recorded="false",idem_table="idempotency_keys",`,
	} {
		if !strings.Contains(text, series) {
			t.Errorf("no series %s", series)
		}
	}
}

// utf8Accept is what a Prometheus 3 server sends when it scrapes: it
// accepts metric names in UTF-8, dots included.
const utf8Accept = "text/plain;version=1.0.0;escaping=allow-utf-8"

// promNames are the Prometheus names of idemotel's metrics.
const promNames = "idem_calls_total idem_duration_seconds_bucket idem_duration_seconds_count idem_duration_seconds_sum " +
	"idem_key_count idem_key_in_progress_max_age_seconds idem_key_unfinished_max_age_seconds " +
	"idem_step_duration_seconds_bucket idem_step_duration_seconds_count idem_step_duration_seconds_sum idem_table_size_bytes"

// TestPrometheusDefaultNames checks the names without a translation
// strategy, as a Prometheus 3 server scrapes them: the same today. The
// exporter announces that its default will change, which is why the
// documentation sets the strategy; this test tells when it did.
func TestPrometheusDefaultNames(t *testing.T) {
	if got := strings.Join(names(scrape(t, utf8Accept)), " "); got != promNames {
		t.Fatalf("metric names without a translation strategy\n got: %s\nwant: %s", got, promNames)
	}
}

// TestDashboardNames checks that the Grafana dashboard queries only the
// names the exporter produces (promNames) and idemotel's labels.
func TestDashboardNames(t *testing.T) {
	data, err := os.ReadFile("../docs/grafana/idem-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range strings.Fields(promNames) {
		known[n] = true
	}
	for _, k := range []attribute.Key{idemotel.OutcomeKey, idemotel.RefusedKey, idemotel.TableKey, idemotel.OperationKey, idemotel.KeyStateKey} {
		known[strings.ReplaceAll(string(k), ".", "_")] = true
	}
	var used []string
	for _, m := range regexp.MustCompile(`\bidem_[a-z_]+\b`).FindAllString(string(data), -1) {
		if !known[m] {
			t.Errorf("the dashboard queries %s, which idemotel does not export", m)
		}
		used = append(used, m)
	}
	if len(used) == 0 {
		t.Fatal("no idem name in the dashboard")
	}
}
