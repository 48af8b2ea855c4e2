// Package idemkafka consumes Kafka records exactly once per consumer name,
// on franz-go: each record's handler runs in the transaction of its idem
// key (package idemconsume), and its offset is committed only once that
// transaction answered.
//
//	import "github.com/idemhq/idem/idemkafka"
//
// # Use
//
//	cl, err := kgo.NewClient(
//		kgo.SeedBrokers("127.0.0.1:9092"),
//		kgo.ConsumerGroup("ledger"),
//		kgo.ConsumeTopics("payments"),
//		kgo.DisableAutoCommit(),    // required: offsets are committed by Consume
//		kgo.BlockRebalanceOnPoll(), // required: no partition moves mid-record
//	)
//	...
//	c, err := idemconsume.New(keys, &idemconsume.Config{Name: "ledger"}, handle)
//	...
//	err = idemkafka.Consume(ctx, cl, c, &idemkafka.Config{DeadLetterTopic: "payments.dlq"})
//
// # What Consume does
//
// It polls, processes each partition's records in order (partitions side by
// side, one goroutine each), one transaction per record, and then commits,
// for each partition, the offset after the last record whose transaction
// answered and was settled; then it lets a waiting rebalance go on. A record
// to retry (its key in progress elsewhere, a failed handler) holds its
// partition: Kafka has no per-record redelivery, and committing past it would
// lose it. The records after a record Consume could not settle (ctx ended)
// are not committed either: the next owner of the partition reads them again
// and replays what already committed.
//
// The key is the producer's id, read from the record headers of
// Config.IDHeaders; without one, the record's position
// "kafka:<topic>/<partition>/<offset>", which does not catch a producer's
// second publish (docs/CONSUMERS.md). The delivery count is kept in the
// process: it starts again at 1 after a restart or a rebalance, so a poison
// record that kills its process each time is never dead-lettered.
//
// A dead letter is the record, produced to Config.DeadLetterTopic with its
// key, value and headers, and the headers idem-dead-letter-reason and
// idem-source ("<topic>/<partition>/<offset>"); the offset is committed only
// after the broker acknowledged that produce.
package idemkafka
