// Package idemhttp is net/http middleware that makes unsafe requests safe to
// retry with an Idempotency-Key header.
//
//	import "github.com/idemhq/idem/idemhttp"
//
// The key, the handler's database writes and its response commit in one
// PostgreSQL transaction, through idem.Run. A retry with the same key never
// runs the handler twice: it receives the stored response, marked
// Idempotent-Replayed: true, or 409 while the first request still runs. A
// response that must not be kept (5xx, and 4xx that reject the request
// before it runs, by default) rolls everything back, and the retry runs the
// handler again. NewMiddleware states the contract in full.
//
//	keys, err := idem.NewClient(pool, nil) // the deployment's idem.Config
//	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{
//		Required: true,
//		Scope:    func(r *http.Request) (string, error) { return userID(r) }, // the authenticated user
//	})
//	mux := http.NewServeMux()
//	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
//		var id int64
//		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
//			"insert into charges (amount) values (500) returning id").Scan(&id)
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: key stays free
//			return
//		}
//		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
//		w.WriteHeader(http.StatusCreated) // commits with the key
//	})
//	http.ListenAndServe(":8080", mw.Handler(mux))
//
// The header is read both as the IETF draft's quoted string
// ("8e03978e-40d5-43e8-bc93-6894a57f9324") and as the bare token Stripe
// clients send; a webhook receiver takes the key from where its sender puts
// it instead (Config.Key: a delivery id header with KeyHeader, or an event
// id in the body).
//
// Keys are scoped by the authenticated principal, so one client's key can
// never replay another client's response: NewMiddleware requires
// Config.Scope (ContextScope reads the scope an authentication middleware
// in front put in the context with idem.ContextWithScope), and a keyed
// request without a principal is refused. Only Config.SharedKeys, an
// explicit opt-in, puts every client in one key space.
//
// Work too long for one transaction (a call to a card processor) is an
// idem.Operation made of steps, which the middleware's single transaction
// cannot span: NewOperationHandler serves one on a route of its own, with
// the same key, scope and problem rules, and lets a waiting client choose
// 202 Accepted with a Location to poll (ServeStatus) instead of 409.
//
// A 5xx is never stored, although the IETF draft (section 2.6) says a
// resource SHOULD replay error answers too: a 5xx reports a technical
// failure (the database, a dependency, a bug), and storing it would commit
// the key with writes that the failure left half done, or hold the retry to
// a failure that has passed. Rolling the key back with the handler's writes
// leaves nothing behind, so the retry with the same key runs cleanly. What
// the draft's rule protects, an outcome the client must not see change, is
// kept: successes and the refusals that report what the operation decided
// (DefaultStoreStatus: 402, 404, a 409 of the handler's own, ...) are
// stored and replayed.
//
// The middleware's own answers are RFC 9457 problem documents whose types
// are the Problem* constants, or whatever Config.WriteProblem renders. A
// handler that calls idem itself (idem.Wrap's function, idem.Run,
// idem.Operation.Run) without the middleware answers the call's errors with
// the same documents through WriteOutcome.
//
// Browsers: Idempotency-Key is not a CORS-safelisted request header, so a
// browser sends a preflight (OPTIONS) before a cross-origin request that
// carries one, and sends the request only if the answer lists the header
// in Access-Control-Allow-Headers. Idempotent-Replayed, Retry-After and
// Location are not safelisted response headers: a script reads them only
// if Access-Control-Expose-Headers lists them. Put the CORS layer in front
// of the middleware, so that it answers preflights (the middleware passes
// OPTIONS through untouched, as every method Config.Methods leaves out)
// and marks the middleware's own answers (409, 422, 503) too; a browser
// hides an answer without Access-Control-Allow-Origin from the script.
package idemhttp
