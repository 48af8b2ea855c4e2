// Package idemotel reports idem's calls to OpenTelemetry: a span and two
// metrics per call, through idem's Observer hook, a span and a duration per
// step of an idem.Operation (idem.StepObserver), and the health of the key
// table as observable gauges. It uses OpenTelemetry's API only; the
// application chooses the SDK and exporters (the global providers unless
// WithTracerProvider and WithMeterProvider say otherwise).
//
//	obs := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
//	keys, err := idem.NewClient(pool, &idem.Config{Observer: obs}) // every call
//	v, err := idem.Do(ctx, pool, key, hash, fn, idem.WithObserver(obs)) // or one call
//	mw, err := idemhttp.NewMiddleware(keys, nil) // requests report to keys' Observer
//	reg, err := idemotel.RegisterStats(keys, idemotel.WithMeterProvider(mp))
//
// # Names
//
// Every call of idem.Do, idem.Run and a function from idem.Wrap, and every
// covered request with a key under idemhttp (and every request idemhttp
// turns away before any call: a malformed key, an oversized body) is one
// span and one count, whatever its outcome. Every step of an
// idem.Operation's call (idem.Step, idem.External) is one idem.Step span, a
// child of the call's span and the parent of what the step's code traces
// from its context, and one idem.step.duration record; a step an earlier
// owner recorded, which returns its output without running, is one too,
// with idem.step.recorded true and a duration of 0. The names are stable;
// dashboards depend on them.
//
//	name                          instrument               unit    attributes
//	idem.Do (span, kind internal) span                     -       idem.outcome idem.refused idem.waited idem.table
//	                                                               idem.operation* idem.scope** http.response.status_code* error.type*
//	idem.calls                    Int64Counter             {call}  idem.outcome idem.refused idem.table
//	                                                               idem.operation* http.response.status_code* error.type*
//	idem.duration                 Float64Histogram         s       as idem.calls
//	idem.Step (span, internal)    span                     -       idem.table idem.operation idem.step idem.step.kind
//	                                                               idem.step.recorded idem.refused idem.scope** error.type*
//	idem.step.duration            Float64Histogram         s       idem.table idem.operation idem.step idem.step.kind
//	                                                               idem.step.recorded idem.refused error.type*
//	idem.key.count                Int64ObservableUpDown... {key}   idem.table idem.key.state (RegisterStats)
//	idem.key.in_progress.max_age  Float64ObservableGauge   s       idem.table (RegisterStats)
//	idem.table.size               Int64ObservableUpDown... By      idem.table (RegisterStats)
//
//	* when it applies   ** only with WithScopeOnSpans(true)
//
// Prometheus names, with the OpenTelemetry Prometheus exporter and
// otlptranslator.UnderscoreEscapingWithSuffixes (dots become underscores,
// units and _total are appended): idem_calls_total, idem_duration_seconds
// (_bucket, _sum, _count), idem_step_duration_seconds (likewise),
// idem_key_count, idem_key_in_progress_max_age_seconds,
// idem_table_size_bytes; attributes likewise (idem_outcome, idem_refused,
// idem_step_kind, http_response_status_code, error_type...).
//
// The attributes:
//
//	idem.outcome               executed, replayed, refused, in_progress, mismatch, failed,
//	                           outcome_unknown, invalid (idem.Outcome's String). A replay is
//	                           replayed whatever it replays.
//	idem.refused               true when the call returned a stored business refusal: refused,
//	                           or a replay of a refusal; for a step, when it returned a refusal.
//	idem.waited                true when the call waited for another holder (idem.WithWait).
//	idem.table                 the key table.
//	idem.operation             the operation of idem.Wrap, for a wrapped function's calls; the
//	                           name given to idem.NewOperation, for its steps.
//	idem.step                  the step's name (idem.Step, idem.External).
//	idem.step.kind             database (idem.Step) or external (idem.External).
//	idem.step.recorded         true for a step recorded earlier, which did not run.
//	idem.scope                 the caller's scope (for Wrap, without the operation).
//	http.response.status_code  the status idemhttp answered; absent outside idemhttp and
//	                           when the handler panicked.
//	error.type                 for in_progress, mismatch, failed, outcome_unknown and invalid:
//	                           the idem error wrapped ("idem.ErrInProgress", "idem.ErrMismatch",
//	                           "idem.ErrOutcomeUnknown", "idem.ErrInvalidKey", ...),
//	                           "context.Canceled" or "context.DeadlineExceeded", a PostgreSQL
//	                           error's SQLSTATE ("40001"), the value of an ErrorType() string
//	                           method in the chain (the semconv convention; "panic" when fn
//	                           panicked, "idemhttp.invalid-key" and the like for requests
//	                           idemhttp turned away), the HTTP status for a bare error under
//	                           idemhttp, else the error's Go type ("*pay.CardError"). For a
//	                           step, the error it returned, a refusal excepted
//	                           ("idem.ErrLeaseLost", "*errors.errorString", ...).
//	idem.key.state             live (estimated: absent until PostgreSQL has measured the
//	                           table), expired (awaiting the sweeper), in_progress (exact).
//
// # Span status
//
// A call that failed on the server's side (failed, outcome_unknown) or was
// called wrongly (invalid) gets status Error and an "exception" event with
// exception.type. A key in progress or reused for another request is the
// client's condition, as a 4xx is for an HTTP server span: error.type is set,
// the status is left unset. So is an idemhttp answer below 500 (a 400 for a
// malformed key, a handler's own 4xx that was not stored). A step that
// returned an error gets status Error and the event likewise; one that
// returned a refusal does not.
//
// # What is never exported
//
// The idempotency key: it is client data, and whoever holds it can read
// the stored answer. Error messages are not recorded either, since fn's
// errors may quote the key or other client data; WithErrorMessages(true)
// records them on spans. The scope, a tenant or user id, is recorded on
// spans only with WithScopeOnSpans(true), and never on metrics, where it
// would make one series per tenant.
//
// # Cost
//
// Without an observer idem allocates nothing for the hook. With idemotel,
// the hook's own work is a few microseconds per call on the SDK (see
// BenchmarkHook), against a replay's few hundred.
package idemotel
