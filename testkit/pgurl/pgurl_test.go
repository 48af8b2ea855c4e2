package pgurl

import "testing"

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"},
		{"postgresql://u:p@h/db", "postgresql://u:p@h/x"},
		{"host=h user=u", "host=h user=u dbname=x"},
	}
	for _, c := range cases {
		if got := WithDatabase(c.in, "x"); got != c.want {
			t.Errorf("WithDatabase(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	if got := Redact("postgres://u:secret@h:5432/db"); got != "h:5432/db" {
		t.Fatalf("Redact = %q", got)
	}
	if got := Redact("host=h password=secret"); got != "a connection string" {
		t.Fatalf("Redact = %q", got)
	}
}

func TestWithoutPassword(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/db?sslmode=disable", "postgres://postgres@127.0.0.1:5432/db?sslmode=disable"},
		{"postgres://u:secret@h:5432/db?sslmode=disable", "postgres://u@h:5432/db?sslmode=disable"},
		{"postgresql://u@h/db?password=secret&sslmode=disable", "postgresql://u@h/db?sslmode=disable"},
		{"host=h password=secret dbname=db", "host=h dbname=db"},
		{"password='se cr\\'et' host=h sslpassword=keep", "host=h sslpassword=keep"},
	}
	for _, c := range cases {
		if got := WithoutPassword(c.in); got != c.want {
			t.Errorf("WithoutPassword(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
