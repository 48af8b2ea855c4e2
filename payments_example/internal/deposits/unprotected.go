package deposits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// retryDelay is how soon ConsumeUnprotected has a message whose
// transaction failed delivered again.
const retryDelay = 200 * time.Millisecond

// ConsumeUnprotected credits the deposits that cons delivers as code
// without idem would: the same credit in a plain transaction on pool per
// delivery, the message acknowledged after COMMIT, terminated when it can
// never be credited and delivered again after any other failure. It
// exists to show what Consume prevents; never use it. A delivery after a
// crash between COMMIT and the acknowledgement, and a producer's second
// publish, are credited again. It returns nil once ctx has ended.
func ConsumeUnprotected(ctx context.Context, cons jetstream.Consumer, pool *pgxpool.Pool, log *slog.Logger) error {
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if ctx.Err() != nil {
			return // abandoned: delivered again after AckWait
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return credit(ctx, tx, msg.Headers().Get(jetstream.MsgIDHeader), msg.Data())
		})
		switch {
		case err == nil:
			err = msg.DoubleAck(ctx)
		case errors.Is(err, ErrInvalid):
			err = msg.TermWithReason(err.Error())
		case ctx.Err() == nil:
			log.Warn("deposit not credited; delivered again", "err", err)
			err = msg.NakWithDelay(retryDelay)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("deposit: settling the message failed", "err", err)
		}
	}, jetstream.PullMaxMessages(batch))
	if err != nil {
		return fmt.Errorf("deposits: consume: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	return nil
}
