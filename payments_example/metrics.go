package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// serviceName names the service in its metrics (target_info's
// service_name) unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says
// otherwise.
const serviceName = "payments_example"

// newMetrics returns the service's MeterProvider and the handler of
// GET /metrics, which serves what the MeterProvider recorded in
// Prometheus's text format: the OpenTelemetry Prometheus exporter reads
// the MeterProvider at each scrape, into a registry of the service's own
// (Prometheus's global one would refuse a second service in the same
// process, as the tests start). Shut the MeterProvider down when done.
func newMetrics(ctx context.Context, log *slog.Logger) (*sdkmetric.MeterProvider, http.Handler, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// The names docs/grafana/idem-dashboard.json queries:
		// idem_calls_total, idem_duration_seconds, idem_key_count. Set
		// explicitly, since the exporter announces a change of its default.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
	)
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A metric that cannot be gathered is logged; the others are
		// served all the same.
		ErrorHandling: promhttp.ContinueOnError,
	})
	return mp, h, nil
}
