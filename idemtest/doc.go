// Package idemtest proves, in an application's own tests, that an operation
// run through idem.Do, idem.Run or idem.Wrap is exactly-once: that it does
// its writes through the transaction idem gives it, that a retry after a
// lost result does not repeat the effect, that concurrent duplicates take
// effect once, and that the same key with another request is refused.
//
// Give it the operation as the application calls it, the database, a
// request, and a count of the operation's effects; Run runs the battery as
// subtests:
//
//	func TestChargeExactlyOnce(t *testing.T) {
//		pool := newTestPool(t)
//		svc := &Service{pool: pool}
//		idemtest.Suite[ChargeRequest, Charge]{
//			Call:    idem.Wrap(pool, "payments.charge", svc.Charge),
//			DB:      pool,
//			Request: ChargeRequest{AccountID: 1, Amount: 500},
//			Effects: func(ctx context.Context) (n int, err error) {
//				err = pool.QueryRow(ctx, "select count(*) from charges").Scan(&n)
//				return n, err
//			},
//		}.Run(t)
//	}
//
// Suite.Run lists the scenarios and what each asserts. An operation that
// writes through the pool instead of its transaction fails
// WritesInTransaction: the kit makes a call fail after the work ran and
// finds its writes still there. A request hash that leaves out part of the
// request fails ChangedRequest; a Call that changes the result after idem
// returns it fails Retries; a Call that drops errors fails FailureNotStored.
// Each failure says what is wrong.
//
// Two things to know. The database must stay open until the test ends (the
// kit cleans up then, after the test function returned): close the pool
// with t.Cleanup, not defer. And every scenario sends Suite.Request, under
// keys of its own: an operation that refuses a second use of one business
// object (an order paid once) needs Suite.NewRequest, which makes each
// scenario's request.
//
// Package idemhttptest does the same for HTTP handlers behind idemhttp.
package idemtest
