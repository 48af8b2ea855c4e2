package idemotel

import "go.opentelemetry.io/otel/attribute"

// The names idemotel emits. They are stable: dashboards and alerts depend on
// them. The package documentation lists each with its type, unit and
// attributes.
const (
	// SpanName is the name of the span of every call: idem.Do, idem.Run,
	// a function from idem.Wrap, and a request under idemhttp.
	SpanName = "idem.Do"
	// StepSpanName is the name of the span of every step of an
	// idem.Operation (idem.Step, idem.External), a child of its call's
	// span.
	StepSpanName = "idem.Step"

	// MetricCalls counts calls (unit {call}); Prometheus: idem_calls_total.
	MetricCalls = "idem.calls"
	// MetricDuration is the histogram of call durations in seconds;
	// Prometheus: idem_duration_seconds.
	MetricDuration = "idem.duration"
	// MetricStepDuration is the histogram of the durations of the steps of
	// idem.Operation calls in seconds; Prometheus:
	// idem_step_duration_seconds.
	MetricStepDuration = "idem.step.duration"
	// MetricKeyCount is the number of keys in the table by state (unit
	// {key}); Prometheus: idem_key_count.
	MetricKeyCount = "idem.key.count"
	// MetricInProgressMaxAge is the age of the oldest key in progress in
	// seconds; Prometheus: idem_key_in_progress_max_age_seconds.
	MetricInProgressMaxAge = "idem.key.in_progress.max_age"
	// MetricUnfinishedMaxAge is the age of the oldest unfinished operation
	// (idem.Operation) in seconds; Prometheus:
	// idem_key_unfinished_max_age_seconds.
	MetricUnfinishedMaxAge = "idem.key.unfinished.max_age"
	// MetricTableSize is the size of the key table with its indexes in
	// bytes; Prometheus: idem_table_size_bytes.
	MetricTableSize = "idem.table.size"
)

// The attributes idemotel sets. http.response.status_code and error.type
// are OpenTelemetry's own (semconv).
const (
	// OutcomeKey is how a call ended: idem.Outcome's String, one of
	// executed, replayed, refused, in_progress, mismatch, failed,
	// outcome_unknown, invalid. Spans and metrics.
	OutcomeKey = attribute.Key("idem.outcome")
	// RefusedKey is true when the call returned a stored business refusal:
	// a first execution that refused, or a replay of one. Spans and metrics.
	RefusedKey = attribute.Key("idem.refused")
	// WaitedKey is true when the call waited for another holder of its key
	// (idem.WithWait). Spans only.
	WaitedKey = attribute.Key("idem.waited")
	// TableKey is the key table. Spans and metrics.
	TableKey = attribute.Key("idem.table")
	// ResumeKey is true for a call of idem.Operation.Resume (a completer
	// finishing an operation, not a client's call); absent otherwise.
	// Spans and metrics.
	ResumeKey = attribute.Key("idem.resume")
	// OperationKey is the operation given to idem.Wrap, for calls of a
	// wrapped function, and the name given to idem.NewOperation, for its
	// steps. Spans and metrics.
	OperationKey = attribute.Key("idem.operation")
	// ScopeKey is the scope of the key (for Wrap, the caller's scope
	// without the operation). Spans only, and only with
	// WithScopeOnSpans(true): scopes are tenant or user ids.
	ScopeKey = attribute.Key("idem.scope")
	// StepKey is the name of a step of an idem.Operation. Step spans and
	// MetricStepDuration.
	StepKey = attribute.Key("idem.step")
	// StepKindKey is the kind of a step: database (idem.Step) or external
	// (idem.External). Step spans and MetricStepDuration.
	StepKindKey = attribute.Key("idem.step.kind")
	// StepRecordedKey is true for a step that an earlier owner of the
	// operation recorded, which returned its recorded output without
	// running. Step spans and MetricStepDuration.
	StepRecordedKey = attribute.Key("idem.step.recorded")
	// KeyStateKey is the state of the keys MetricKeyCount counts: live,
	// expired or in_progress.
	KeyStateKey = attribute.Key("idem.key.state")
)
