package unary

import (
	"strings"
	"testing"

	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

func TestIsUUID(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{"8E03978E-40D5-43E8-BC93-6894A57F9324", true},
		{"01890a5d-ac96-774b-bcce-b302099a8057", true}, // version 7
		{"00000000-0000-0000-0000-000000000001", true},
		{"00000000-0000-0000-0000-000000000000", false}, // the nil UUID
		{"8e03978e40d543e8bc936894a57f9324", false},     // no hyphens
		{"{8e03978e-40d5-43e8-bc93-6894a57f9324}", false},
		{"urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324", false},
		{"8e03978e-40d5-43e8-bc93-6894a57f932", false},
		{"8e03978e-40d5-43e8-bc93-6894a57f9324a", false},
		{"8e03978e-40d5-43e8-bc93_6894a57f9324", false},
		{"8e03978g-40d5-43e8-bc93-6894a57f9324", false},
		{"8e03978e-40d5-43e8-bc93-6894a57f932\x00", false},
		{"", false},
	} {
		if got := IsUUID(tc.s); got != tc.want {
			t.Errorf("IsUUID(%q) = %t, want %t", tc.s, got, tc.want)
		}
	}
}

func TestKey(t *testing.T) {
	const id = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	withField := &Method{keyField: "request_id"}
	metadataOnly := &Method{}
	for _, tc := range []struct {
		name   string
		m      *Method
		values []string
		id     string
		want   string
		reason string
		field  string
	}{
		{name: "none", m: withField},
		{name: "metadata", m: metadataOnly, values: []string{"k1"}, want: "k1"},
		{name: "metadata ignores the field", m: metadataOnly, values: []string{"k1"}, id: "not-a-uuid", want: "k1"},
		{name: "field", m: withField, id: id, want: id},
		{name: "empty field falls back to metadata", m: withField, values: []string{"k1"}, want: "k1"},
		{name: "field and metadata agree", m: withField, values: []string{id}, id: id, want: id},
		{name: "field and metadata disagree", m: withField, values: []string{"k1"}, id: id, reason: ReasonInvalidKey, field: "request_id"},
		{name: "field not a UUID", m: withField, id: "k1", reason: ReasonInvalidKey, field: "request_id"},
		{name: "two metadata values", m: withField, values: []string{"a", "a"}, reason: ReasonInvalidKey},
		{name: "empty metadata value", m: metadataOnly, values: []string{""}, reason: ReasonInvalidKey},
		{name: "metadata too long", m: metadataOnly, values: []string{strings.Repeat("k", 256)}, reason: ReasonInvalidKey},
		{name: "metadata at the limit", m: metadataOnly, values: []string{strings.Repeat("k", 255)}, want: strings.Repeat("k", 255)},
		{name: "metadata with a control character", m: metadataOnly, values: []string{"a\tb"}, reason: ReasonInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problem := tc.m.key(tc.values, &chargev1.ChargeRequest{RequestId: tc.id})
			switch {
			case tc.reason == "" && problem != nil:
				t.Fatalf("refused: %+v", problem)
			case tc.reason != "" && (problem == nil || problem.reason != tc.reason || problem.field != tc.field || problem.message == ""):
				t.Fatalf("problem %+v, want reason %s and field %q", problem, tc.reason, tc.field)
			case got != tc.want:
				t.Fatalf("key %q, want %q", got, tc.want)
			}
		})
	}
}
