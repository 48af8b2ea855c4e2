// Package idemriver finishes the operations (idem.Operation) whose client
// never came back: a completer on River (github.com/riverqueue/river),
// PostgreSQL's own job queue.
//
// An operation made of steps stays unfinished when its client gives up
// between steps: a timeout, a crash, a lost network. A retry with its key
// would continue it; the completer does so without one. OnStart, put in
// idem.OperationConfig.OnStart, inserts a job (CompleteArgs) with River's
// InsertTx in the transaction that begins the operation, so the job
// exists if and only if the operation began. The job is scheduled past
// the operation's lease; Worker then runs it, through the operation's
// Resume, from the request stored with the operation:
//
//   - an operation its client finished meanwhile replays: the job is done;
//   - an unfinished one continues from what its steps recorded, as a
//     client's retry would (a recorded step does not run again; an
//     external step runs again with the same derived key), to its answer,
//     a stored refusal, or, past its Deadline, its Compensate's answer;
//   - one whose owner is at work makes the job wait (river.JobSnooze) and
//     look again;
//   - a failure leaves the job to River's retries, each continuing from
//     the steps recorded so far.
//
// Worker.Work states the contract in full. An operation whose job was
// given up on (River's MaxAttempts, or a job cancelled) stays unfinished,
// counted by idem.Stats.Unfinished, until a client retries it or a job is
// inserted for it again.
//
// # Setup
//
// The River client that inserts the jobs and the one that works them may
// be one: make its Workers first, the client, then the operations (whose
// OnStart names the client), and register their Worker before the client
// starts:
//
//	workers := river.NewWorkers()
//	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		Queues:  map[string]river.QueueConfig{idemriver.QueueName: {MaxWorkers: 10}},
//		Workers: workers,
//	})
//	charge, err := idem.NewOperation(keys, "charge", chargeSteps, &idem.OperationConfig[Req, Resp]{
//		OnStart: idemriver.OnStart(rc, 0), // after must exceed the Lease
//	})
//	completer, err := idemriver.NewWorker(charge)
//	river.AddWorker(workers, completer)
//	err = rc.Start(ctx)
//
// River's settings apply to the jobs as to any: its JobTimeout bounds one
// resume, its retry policy spaces the runs after a failure, and its
// rescuer runs again a job whose process died.
package idemriver
