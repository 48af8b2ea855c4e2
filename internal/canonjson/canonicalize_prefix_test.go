package canonjson_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/idemhq/idem/internal/canonjson"
)

// Every prefix of a document, cut at any byte, is refused with an error
// exactly when encoding/json refuses it, and never panics: a body cut short
// in transit (a truncated request) must be bad input, not a crash, wherever
// the cut falls (right after '[', after an object key, inside an escape).
func TestCanonicalJSONEveryPrefix(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`{"a":[1,{"b":"c\u00e9\n"},-1.5e3,true,false,null,[]],"d":{},"e":""}`,
		`[ { "k" : [ [ ] , { } ] } , 0 , -0.0 , 1E+2 , "\"\\\/\b\f\r\t\ud83d\ude00" ]`,
		"{\"x\" :\t{\"y\": [\"z\" , 12345678901234567890123]}}",
	} {
		for n := 0; n <= len(doc); n++ {
			prefix := doc[:n]
			t.Run(fmt.Sprintf("%d", n), func(t *testing.T) {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("Canonicalize(%q) panicked: %v", prefix, r)
					}
				}()
				_, err := canonjson.Canonicalize([]byte(prefix))
				if valid := json.Valid([]byte(prefix)); (err == nil) != valid {
					t.Fatalf("Canonicalize(%q): %v, but json.Valid says %v", prefix, err, valid)
				}
			})
		}
	}
}
