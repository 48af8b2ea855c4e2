package openapicheck

import (
	"context"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// componentsName is the file name services use in their $refs.
const componentsName = "idempotency.yaml"

// noDatabase is a pool for a Client that never reaches a database:
// pgxpool connects lazily, and this one could not.
func noDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// components is the document as a service publishes it, for a Client with
// a key lifetime other than the default (OpenAPIComponents states it).
func components(t *testing.T) []byte {
	t.Helper()
	keys, err := idem.NewClient(noDatabase(t), &idem.Config{TTL: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return idemhttp.OpenAPIComponents(keys)
}

// loadComponents loads the embedded document as kin-openapi sees it.
func loadComponents(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(components(t))
	if err != nil {
		t.Fatalf("load %s: %v", componentsName, err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("validate %s: %v", componentsName, err)
	}
	return doc
}

// TestOpenAPIComponentsValidate loads the component document on its own and
// through a service document that $refs every parameter, header, schema,
// example and response of it from another file, the way a service uses
// it, and validates both with kin-openapi.
func TestOpenAPIComponentsValidate(t *testing.T) {
	doc := loadComponents(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi %q, want 3.0.3", doc.OpenAPI)
	}

	var w strings.Builder
	w.WriteString("openapi: 3.0.3\ninfo: {title: wrapper, version: '1'}\npaths:\n")
	ref := func(kind, name string) string {
		return fmt.Sprintf("{$ref: '%s#/components/%s/%s'}", componentsName, kind, name)
	}
	// One operation per parameter: both are named Idempotency-Key.
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Parameters)) {
		fmt.Fprintf(&w, "  /param/%s:\n    post:\n      parameters: [%s]\n      responses:\n        '204': {description: ok}\n", name, ref("parameters", name))
	}
	w.WriteString("  /everything:\n    post:\n      responses:\n")
	w.WriteString("        '200':\n          description: every header, schema and example\n          headers:\n")
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Headers)) {
		fmt.Fprintf(&w, "            X-%s: %s\n", name, ref("headers", name))
	}
	w.WriteString("          content:\n")
	for i, name := range slices.Sorted(maps.Keys(doc.Components.Schemas)) {
		fmt.Fprintf(&w, "            application/x-%d+json:\n              schema: %s\n", i, ref("schemas", name))
	}
	w.WriteString("            application/problem+json:\n              examples:\n")
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Examples)) {
		fmt.Fprintf(&w, "                %s: %s\n", name, ref("examples", name))
	}
	// A status per response: 2xx codes only serve to hold every response.
	for i, name := range slices.Sorted(maps.Keys(doc.Components.Responses)) {
		fmt.Fprintf(&w, "        '%d': %s\n", 201+i, ref("responses", name))
	}

	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	published := components(t)
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		if strings.HasSuffix(u.Path, componentsName) {
			return published, nil
		}
		return nil, fmt.Errorf("unexpected reference to %s", u)
	}
	wrapper, err := loader.LoadFromDataWithPath([]byte(w.String()), &url.URL{Path: "service.yaml"})
	if err != nil {
		t.Fatalf("load a service document referencing every component: %v\n%s", err, w.String())
	}
	if err := wrapper.Validate(t.Context()); err != nil {
		t.Fatalf("validate a service document referencing every component: %v\n%s", err, w.String())
	}
}

// idemhttpDir is the source of the package under test, beside the tools
// module (which replace builds against it).
var idemhttpDir = filepath.Join("..", "..", "idemhttp")

// problems is what the middleware answers, read from idemhttp's source so
// that a new problem type cannot be missed and no table is copied here: the
// Problem* string constants, and the status and title of each type, from the
// package's problemStatus and problemTitle tables.
type problems struct {
	consts map[string]string // constant name to problem type
	status map[string]int    // problem type to HTTP status
	title  map[string]string // problem type to title
}

// stdOnly imports the standard library's packages and refuses others.
type stdOnly struct{ types.Importer }

func (s stdOnly) Import(path string) (*types.Package, error) {
	if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
		return nil, fmt.Errorf("%s: not imported", path)
	}
	return s.Importer.Import(path)
}

// readProblems type-checks idemhttp's non-test files and evaluates its
// problem tables.
func readProblems(t *testing.T) problems {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(idemhttpDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// Only the standard library is imported, for net/http's Status*
	// constants: the tables need nothing else, and type-checking idemhttp's
	// dependencies from source would take seconds. Errors from the missing
	// imports are expected; the tables are checked below to be constant.
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{
		Importer: stdOnly{importer.ForCompiler(fset, "gc", nil)},
		Error:    func(error) {},
	}
	pkg, _ := conf.Check("github.com/idemhq/idem/idemhttp", fset, files, info)
	p := problems{consts: map[string]string{}, status: map[string]int{}, title: map[string]string{}}
	for _, name := range pkg.Scope().Names() {
		c, ok := pkg.Scope().Lookup(name).(*types.Const)
		if ok && c.Exported() && strings.HasPrefix(name, "Problem") && c.Val().Kind() == constant.String {
			p.consts[name] = constant.StringVal(c.Val())
		}
	}
	if len(p.consts) == 0 {
		t.Fatal("no Problem* constants found")
	}
	// table evaluates the map literal assigned to the package variable name.
	table := func(name string, put func(key string, v constant.Value)) {
		for _, f := range files {
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.VAR {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if id.Name != name || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.CompositeLit)
						if !ok {
							t.Fatalf("%s is no map literal", name)
						}
						for _, elt := range lit.Elts {
							kv := elt.(*ast.KeyValueExpr)
							k, v := info.Types[kv.Key].Value, info.Types[kv.Value].Value
							if k == nil || v == nil || k.Kind() != constant.String {
								t.Fatalf("%s: %s is not constant", name, fset.Position(kv.Pos()))
							}
							put(constant.StringVal(k), v)
						}
						return
					}
				}
			}
		}
		t.Fatalf("no variable %s in %s", name, idemhttpDir)
	}
	table("problemStatus", func(k string, v constant.Value) {
		n, _ := constant.Int64Val(v)
		p.status[k] = int(n)
	})
	table("problemTitle", func(k string, v constant.Value) { p.title[k] = constant.StringVal(v) })
	return p
}

// enumOf returns the single value a schema's property is restricted to,
// looking through allOf.
func enumOf(s *openapi3.Schema, prop string) []any {
	if p := s.Properties[prop]; p != nil && len(p.Value.Enum) > 0 {
		return p.Value.Enum
	}
	for _, sub := range s.AllOf {
		if e := enumOf(sub.Value, prop); e != nil {
			return e
		}
	}
	return nil
}

// TestOpenAPIComponentsCoverProblems checks that docs cannot drift from
// code: every Problem* constant has a response in the component document
// whose problem+json schema admits exactly that type and the status the
// middleware answers it with, whose example carries both, and whose
// description names the type; 409 and 503 declare Retry-After.
func TestOpenAPIComponentsCoverProblems(t *testing.T) {
	doc := loadComponents(t)
	p := readProblems(t)
	consts, problemStatus, problemTitle := p.consts, p.status, p.title
	found := map[string]bool{}
	for name, resp := range doc.Components.Responses {
		mt := resp.Value.Content.Get("application/problem+json")
		if mt == nil || mt.Schema == nil {
			t.Errorf("response %s: no application/problem+json schema", name)
			continue
		}
		types, statuses := enumOf(mt.Schema.Value, "type"), enumOf(mt.Schema.Value, "status")
		if len(types) != 1 || len(statuses) != 1 {
			t.Errorf("response %s: type enum %v and status enum %v, want one value each", name, types, statuses)
			continue
		}
		typ, _ := types[0].(string)
		status, _ := statuses[0].(float64)
		found[typ] = true
		want, known := problemStatus[typ]
		switch {
		case !known:
			t.Errorf("response %s: type %q is no Problem* constant", name, typ)
			continue
		case int(status) != want:
			t.Errorf("response %s (%s): status %v, middleware answers %d", name, typ, status, want)
		}
		if !strings.Contains(*resp.Value.Description, "`"+typ+"`") {
			t.Errorf("response %s: description does not name %s", name, typ)
		}
		if err := mt.Schema.Value.VisitJSON(mt.Example); err != nil {
			t.Errorf("response %s: example does not match its schema: %v", name, err)
		}
		ex := map[string]any{"type": typ, "title": problemTitle[typ], "status": float64(want)}
		if err := mt.Schema.Value.VisitJSON(ex); err != nil {
			t.Errorf("response %s: the middleware's own body %v does not match: %v", name, ex, err)
		}
		retry := resp.Value.Headers["Retry-After"]
		if wantRetry := want == http.StatusConflict || want == http.StatusServiceUnavailable; wantRetry != (retry != nil) {
			t.Errorf("response %s: Retry-After declared %v, middleware sends it %v", name, retry != nil, wantRetry)
		}
	}
	for name, typ := range consts {
		if _, ok := problemStatus[typ]; !ok {
			t.Errorf("%s (%s) has no status in problemStatus", name, typ)
		}
		if !found[typ] {
			t.Errorf("%s (%s) has no response in %s", name, typ, componentsName)
		}
	}
	for name, ex := range doc.Components.Examples {
		v, _ := ex.Value.Value.(map[string]any)
		typ, _ := v["type"].(string)
		if st, ok := problemStatus[typ]; !ok || v["status"] != float64(st) || v["title"] != problemTitle[typ] {
			t.Errorf("example %s: %v does not match the middleware's answer for %q", name, v, typ)
		}
	}
}

// TestOpenAPIKeySchema checks that the published key schema admits only
// what ParseKey accepts, and admits both forms of ordinary keys.
func TestOpenAPIKeySchema(t *testing.T) {
	schema := loadComponents(t).Components.Schemas["IdempotencyKey"].Value
	tests := []struct {
		value string
		admit bool
	}{
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, true},
		{"clé-ünïcode", true},
		{`"a \"quoted\" key \\ with escapes"`, true},
		{strings.Repeat("k", 255), true},
		{`"` + strings.Repeat("k", 255) + `"`, true},
		{"", false},
		{`""`, false},
		{strings.Repeat("k", 256), false},
		{strings.Repeat("k", 258), false},
		{`"` + strings.Repeat("k", 256) + `"`, false},
		{"a,b", false},
		{`a"b`, false},
		{`"a"b"`, false},
		{`"a\nb"`, false},
		{"tab\there", false},
		{"nul\x00", false},
		{"c1\u0085", false},
		{`"unterminated`, false},
		{`"non-ascïi"`, false},
	}
	for _, tt := range tests {
		err := schema.VisitJSON(tt.value)
		if admitted := err == nil; admitted != tt.admit {
			t.Errorf("%q: admitted %v, want %v (%v)", tt.value, admitted, tt.admit, err)
		}
		if err != nil {
			continue
		}
		key, perr := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {tt.value}})
		if perr != nil || key == "" {
			t.Errorf("%q: the schema admits it, ParseKey refuses it: %v", tt.value, perr)
		}
	}
}
