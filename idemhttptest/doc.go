// Package idemhttptest proves, in a service's own tests, that an endpoint
// behind idemhttp is exactly-once: that its handler does its writes through
// the request's transaction, that a retry after a lost answer does not
// repeat the effect, that concurrent duplicates take effect once, and that
// the same key with another request is refused.
//
// Give it the service's handler as it is served (or the URL of a running
// service), the database, a request, and a count of the operation's
// effects; Run runs the battery as subtests:
//
//	func TestChargeExactlyOnce(t *testing.T) {
//		pool := newTestPool(t) // the service's database
//		idemhttptest.Suite{
//			Handler: newService(pool), // the whole stack, idemhttp inside
//			DB:      pool,
//			Request: func(t testing.TB) *http.Request {
//				r, _ := http.NewRequest("POST", "/charges", strings.NewReader(`{"amount":500}`))
//				r.Header.Set("Content-Type", "application/json")
//				r.Header.Set("Authorization", "Bearer "+testAPIKey)
//				return r
//			},
//			Effects: func(ctx context.Context) (n int, err error) {
//				err = pool.QueryRow(ctx, "select count(*) from charges").Scan(&n)
//				return n, err
//			},
//		}.Run(t)
//	}
//
//	--- PASS: TestChargeExactlyOnce
//	    --- PASS: TestChargeExactlyOnce/Retries
//	    --- PASS: TestChargeExactlyOnce/LostAnswer
//	    --- PASS: TestChargeExactlyOnce/Concurrent
//	    --- PASS: TestChargeExactlyOnce/ChangedRequest
//	    --- PASS: TestChargeExactlyOnce/FailureNotStored
//	    --- PASS: TestChargeExactlyOnce/WritesInTransaction
//
// Suite.Run lists the scenarios and what each asserts. A handler that
// writes through the pool instead of idemhttp.Tx fails WritesInTransaction:
// the kit makes an attempt fail after the handler ran and finds its writes
// still there. A fingerprint that ignores the body fails ChangedRequest; a
// route outside the middleware fails Retries; a dedupe of the service's own
// that races fails Concurrent. Each failure says what is wrong.
//
// Package idemtest does the same for operations run through idem.Do,
// idem.Run or idem.Wrap.
package idemhttptest
