package idemconsume_test

import (
	"strings"
	"testing"

	"github.com/idemhq/idem/idemconsume"
)

func TestProducerID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", 300)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		names   []string
		want    string
	}{
		{"none", map[string]string{"x": "1"}, idemconsume.DefaultIDHeaders(), ""},
		{"idempotency key first", map[string]string{"Idempotency-Key": "k", "ce_id": "e"}, idemconsume.DefaultIDHeaders(), "k"},
		{"cloudevents id alone", map[string]string{"ce_id": "e"}, idemconsume.DefaultIDHeaders(), "e"},
		{"cloudevents id with its source", map[string]string{"ce-id": "e", "ce-source": "/orders"}, idemconsume.DefaultIDHeaders(), "/orders e"},
		{"amqp cloudevents", map[string]string{"cloudEvents:id": "e", "cloudEvents:source": "s"}, []string{"cloudEvents:id"}, "s e"},
		{"a custom header", map[string]string{"X-Event": "v"}, []string{"X-Event"}, "v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := idemconsume.ProducerID(func(k string) string { return tc.headers[k] }, tc.names); got != tc.want {
				t.Fatalf("ProducerID = %q, want %q", got, tc.want)
			}
		})
	}
	got := idemconsume.ProducerID(func(k string) string { return map[string]string{"ce_id": "e", "ce_source": long}[k] }, []string{"ce_id"})
	if !strings.HasPrefix(got, "ce:") || len(got) > 255 {
		t.Fatalf("a long CloudEvents key became %q", got)
	}
}
