package idem_test

import (
	"bytes"
	"os"
	"testing"
)

// The sweeper's partition maintenance (idem/sql/partitions_make.sql) is a
// copy of the schema's file, which psql users apply: package schema imports
// idem, so idem cannot read schema's copy. The two must not drift apart.
func TestPartitionMaintenanceIsTheSchemasFile(t *testing.T) {
	t.Parallel()
	ours, err := os.ReadFile("sql/partitions_make.sql")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := os.ReadFile("../schema/partitioned/002_idempotency_keys_partitions.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, theirs) {
		t.Fatal("idem/sql/partitions_make.sql differs from schema/partitioned/002_idempotency_keys_partitions.sql: copy the schema's file over it")
	}
}
