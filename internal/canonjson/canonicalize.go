package canonjson

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// The parser makes one pass over the input and writes each value's canonical
// spelling to one output buffer in input order. Objects whose members arrive
// already sorted (always so for canonical input) are final as written. An
// object whose members are out of order is put in order in place when it
// closes, unless reordering in place had already moved more bytes inside it
// than it holds: then it is recorded (its span and its members' spans) and
// put in order by a final pass that copies each byte once. By induction, the
// bytes moved in place inside any object are at most twice its size, so the
// work stays linear in the input however deeply out-of-order objects nest,
// where reordering every object in place would copy a hostile body's bytes
// once per level.

const (
	// maxDepth bounds nesting so hostile bodies cannot exhaust the stack: a
	// value nested in more than maxDepth arrays or objects is refused.
	maxDepth = 512

	// maxExponent bounds the decimal exponent of a number written in
	// scientific notation (d.ddd×10^n, |n| <= maxExponent). Numbers compare
	// as exact decimals, so without a bound a 12-byte 1e999999999999 would be
	// a value no one can hold; with it, 1e999 and 1e-999 are fine.
	maxExponent = 1_000_000

	// maxPlainZeros is the largest number of trailing zeros an integer is
	// written with; beyond it, scientific notation. Every integer below
	// 10^21 is written in plain digits (10^21 is where JavaScript and
	// encoding/json switch to exponents), and so is every integer written in
	// plain digits with at most 20 trailing zeros, yet 1e999 cannot make the
	// canonical form 1,000 bytes long.
	maxPlainZeros = 20
)

// Canonicalize returns the canonical form of the JSON document doc, or an
// error that names the problem and its byte offset. It is idem.CanonicalJSON
// without the "idem: canonical JSON: " prefix on its errors; that function's
// documentation states the grammar, what is refused and the canonical
// spelling.
func Canonicalize(doc []byte) ([]byte, error) {
	// Room for a few escapes before out must grow.
	p := &parser{in: doc, out: make([]byte, 0, len(doc)+len(doc)/16+16)}
	p.objs, p.stack, p.keys = p.small.objs[:0], p.small.stack[:0], p.small.keys[:0]
	p.order, p.reordered = p.small.order[:0], p.small.reordered[:0]
	p.folded, p.byFold = p.small.folded[:0], p.small.byFold[:0]
	p.skipSpace()
	if err := p.value(0); err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos < len(p.in) {
		return nil, p.errorf(p.pos, "unexpected %s after the value", p.describe(p.pos))
	}
	if len(p.objs) == 0 {
		return p.out, nil
	}
	// Some object needs its members reordered; every other byte is final.
	return p.emit(make([]byte, 0, len(p.out)), 0, len(p.out), 0, len(p.objs)), nil
}

type parser struct {
	in  []byte
	pos int // next byte of in to read
	out []byte

	// objs records, in the order their '{' appears, the objects whose text
	// in out the final pass must reorder (their own members or a
	// descendant's). Every other byte of out is final as written.
	objs []object
	mems []span // members of the recorded objects, each object's contiguous

	stack []member // members of the objects being parsed
	keys  []byte   // unescaped keys of the members on the stack
	moved int      // bytes copied so far to reorder objects in place

	// Scratch space for the end of each object.
	order     []int
	reordered []byte
	folded    []byte
	byFold    []foldedKey

	// Initial backing arrays for the slices above, so that a typical body
	// costs one allocation for all of them rather than one per growth.
	small struct {
		objs      [8]object
		stack     [16]member
		keys      [256]byte
		order     [16]int
		reordered [256]byte
		folded    [256]byte
		byFold    [16]foldedKey
	}
}

// object is an object the final pass must reorder: its text is
// out[start:end], its members in canonical order mems[memLo:memHi], and the
// records of objects nested inside it are objs[index+1:next].
type object struct {
	start, end   int
	memLo, memHi int
	next         int
}

// span is one "key":value of an object: its text is out[start:end], and the
// recorded objects inside its value are objs[objLo:objHi].
type span struct {
	start, end   int
	objLo, objHi int
}

// member is a span being parsed, with its key.
type member struct {
	span
	keyLo, keyHi int // the unescaped key in parser.keys
	at           int // offset of the key in the input, for errors
}

type foldedKey struct {
	lo, hi int // the folded key in parser.folded
	m      int // index of its member in the object's members
}

func (p *parser) errorf(at int, format string, args ...any) error {
	return fmt.Errorf("%s at byte %d", fmt.Sprintf(format, args...), at)
}

// describe names the input byte at i for an error message.
func (p *parser) describe(i int) string {
	if i >= len(p.in) {
		return "end of input"
	}
	c := p.in[i]
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value reads one JSON value at p.pos (white space already skipped), nested
// in depth arrays or objects.
func (p *parser) value(depth int) error {
	if depth > maxDepth {
		return p.errorf(p.pos, "nested deeper than %d", maxDepth)
	}
	if p.pos >= len(p.in) {
		return p.errorf(p.pos, "unexpected end of input, want a value")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str(false)
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	}
	return p.errorf(p.pos, "unexpected %s, want a value", p.describe(p.pos))
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(word)) {
		return p.errorf(p.pos, "invalid literal, want %s", word)
	}
	p.out = append(p.out, word...)
	p.pos += len(word)
	return nil
}

func (p *parser) array(depth int) error {
	p.out = append(p.out, '[')
	p.pos++
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.out = append(p.out, ']')
		p.pos++
		return nil
	}
	for {
		if err := p.value(depth + 1); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return p.errorf(p.pos, "unexpected end of input in array")
		}
		switch p.in[p.pos] {
		case ',':
			p.out = append(p.out, ',')
			p.pos++
			p.skipSpace()
		case ']':
			p.out = append(p.out, ']')
			p.pos++
			return nil
		default:
			return p.errorf(p.pos, "unexpected %s in array, want ',' or ']'", p.describe(p.pos))
		}
	}
}

func (p *parser) object(depth int) error {
	start, index, base, keysBase, moved := len(p.out), len(p.objs), len(p.stack), len(p.keys), p.moved
	// A placeholder keeps the records in the order the objects begin, which
	// is the order emit walks them; it is dropped if the object is in order.
	p.objs = append(p.objs, object{start: start})
	p.out = append(p.out, '{')
	p.pos++
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
	} else {
		for {
			if err := p.member(depth); err != nil {
				return err
			}
			p.skipSpace()
			if p.pos >= len(p.in) {
				return p.errorf(p.pos, "unexpected end of input in object")
			}
			if p.in[p.pos] == '}' {
				p.pos++
				break
			}
			if p.in[p.pos] != ',' {
				return p.errorf(p.pos, "unexpected %s in object, want ',' or '}'", p.describe(p.pos))
			}
			p.out = append(p.out, ',')
			p.pos++
			p.skipSpace()
		}
	}
	p.out = append(p.out, '}')

	members := p.stack[base:]
	if err := p.checkDuplicates(members); err != nil {
		return err
	}
	sorted := true
	for i := 1; i < len(members); i++ {
		if bytes.Compare(p.key(members[i-1]), p.key(members[i])) > 0 {
			sorted = false
			break
		}
	}
	switch {
	case sorted && len(p.objs) == index+1:
		// In order, and so is everything inside: final as written.
		p.objs = p.objs[:index]
	case !sorted && len(p.objs) == index+1 && p.moved-moved <= len(p.out)-start:
		// Reorder now: the bytes already moved inside this object are no
		// more than it holds, which keeps the total work linear.
		p.objs = p.objs[:index]
		p.reorderInPlace(start, members)
	default:
		// Leave it to the final pass, which copies each byte once.
		memLo := len(p.mems)
		for _, i := range p.sortedOrder(members) {
			p.mems = append(p.mems, members[i].span)
		}
		p.objs[index] = object{start: start, end: len(p.out), memLo: memLo, memHi: len(p.mems), next: len(p.objs)}
	}
	p.stack = p.stack[:base]
	p.keys = p.keys[:keysBase]
	return nil
}

// sortedOrder returns the indexes of members in canonical order: by the
// UTF-8 bytes of the unescaped key, a total order since keys are unique.
func (p *parser) sortedOrder(members []member) []int {
	p.order = p.order[:0]
	for i := range members {
		p.order = append(p.order, i)
	}
	slices.SortFunc(p.order, func(a, b int) int { return bytes.Compare(p.key(members[a]), p.key(members[b])) })
	return p.order
}

// reorderInPlace rewrites the object whose text starts at out[start] with its
// members in canonical order. The object holds no recorded object, so no
// record points into the bytes it moves.
func (p *parser) reorderInPlace(start int, members []member) {
	buf := p.reordered[:0]
	for j, i := range p.sortedOrder(members) {
		if j > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, p.out[members[i].start:members[i].end]...)
	}
	p.moved += copy(p.out[start+1:], buf)
	p.reordered = buf
}

// member reads one "key": value pair and pushes it on p.stack.
func (p *parser) member(depth int) error {
	if p.pos >= len(p.in) || p.in[p.pos] != '"' {
		return p.errorf(p.pos, "unexpected %s in object, want a string key", p.describe(p.pos))
	}
	m := member{span: span{start: len(p.out)}, at: p.pos, keyLo: len(p.keys)}
	if err := p.str(true); err != nil {
		return err
	}
	m.keyHi = len(p.keys)
	p.skipSpace()
	if p.pos >= len(p.in) || p.in[p.pos] != ':' {
		return p.errorf(p.pos, "unexpected %s after object key, want ':'", p.describe(p.pos))
	}
	p.out = append(p.out, ':')
	p.pos++
	p.skipSpace()
	m.objLo = len(p.objs)
	if err := p.value(depth + 1); err != nil {
		return err
	}
	m.objHi, m.end = len(p.objs), len(p.out)
	p.stack = append(p.stack, m)
	return nil
}

func (p *parser) key(m member) []byte { return p.keys[m.keyLo:m.keyHi] }

// checkDuplicates refuses an object with two keys equal under simple Unicode
// case folding (bytes.EqualFold), exact duplicates included. encoding/json
// matches keys to struct fields that way and keeps the last match, so
// {"amount":1,"Amount":2} and {"Amount":2,"amount":1} would decode to
// different amounts; no order of such members can be the right fingerprint.
func (p *parser) checkDuplicates(members []member) error {
	if len(members) < 2 {
		return nil
	}
	p.folded, p.byFold = p.folded[:0], p.byFold[:0]
	for i, m := range members {
		lo := len(p.folded)
		p.folded = appendFolded(p.folded, p.key(m))
		p.byFold = append(p.byFold, foldedKey{lo: lo, hi: len(p.folded), m: i})
	}
	fold := func(k foldedKey) []byte { return p.folded[k.lo:k.hi] }
	// Find the first member whose key folds like an earlier one's: by
	// comparing every pair in a small object, by sorting in a large one.
	first, dup := -1, len(members)
	if len(p.byFold) <= 8 {
		for i := 1; i < len(p.byFold) && first < 0; i++ {
			for j := range i {
				if bytes.Equal(fold(p.byFold[j]), fold(p.byFold[i])) {
					first, dup = j, i
					break
				}
			}
		}
	} else {
		// Sorting puts equal folded keys next to each other, in input
		// order; the first duplicate is the earliest second of a run.
		slices.SortFunc(p.byFold, func(a, b foldedKey) int {
			if c := bytes.Compare(fold(a), fold(b)); c != 0 {
				return c
			}
			return a.m - b.m
		})
		for i := 1; i < len(p.byFold); i++ {
			a, b := p.byFold[i-1], p.byFold[i]
			if b.m < dup && bytes.Equal(fold(a), fold(b)) {
				first, dup = a.m, b.m
			}
		}
	}
	if first < 0 {
		return nil
	}
	f, d := members[first], members[dup]
	if bytes.Equal(p.key(f), p.key(d)) {
		return fmt.Errorf("duplicate object key %s at byte %d (first at byte %d)", quoteKey(p.key(d)), d.at, f.at)
	}
	return fmt.Errorf("duplicate object key %s at byte %d: equal under case folding to %s at byte %d",
		quoteKey(p.key(d)), d.at, quoteKey(p.key(f)), f.at)
}

// appendFolded appends key with each rune replaced by the smallest rune of
// its unicode.SimpleFold orbit, so that two keys fold to the same bytes
// exactly when bytes.EqualFold reports them equal. encoding/json folds field
// names the same way. key must be valid UTF-8.
func appendFolded(dst, key []byte) []byte {
	for i := 0; i < len(key); {
		if c := key[i]; c < utf8.RuneSelf {
			// The upper-case ASCII letter is the smallest of its orbit, even
			// for K (K, k, Kelvin sign) and S (S, s, long s).
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(key[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst
}

// foldRune returns the smallest rune of r's simple case folding orbit.
func foldRune(r rune) rune {
	for {
		next := unicode.SimpleFold(r)
		if next <= r {
			return next
		}
		r = next
	}
}

// quoteKey quotes a key for an error message, shortened if long.
func quoteKey(k []byte) string {
	const limit = 64
	if len(k) <= limit {
		return strconv.Quote(string(k))
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(k[cut]) {
		cut--
	}
	return strconv.Quote(string(k[:cut])) + "…"
}

// str reads a string and writes it escaped as json.Marshal escapes it. For
// an object key (key set) it also appends the unescaped key to p.keys.
// Invalid UTF-8, lone surrogate escapes and raw control characters are
// errors: encoding/json would decode the first two as U+FFFD, and a
// fingerprint must not equate them with a real U+FFFD.
func (p *parser) str(key bool) error {
	open := p.pos
	p.out = append(p.out, '"')
	p.pos++
	for {
		run := p.pos
		for run < len(p.in) && plainByte[p.in[run]] {
			run++
		}
		p.out = append(p.out, p.in[p.pos:run]...)
		if key {
			p.keys = append(p.keys, p.in[p.pos:run]...)
		}
		p.pos = run
		if p.pos >= len(p.in) {
			return p.errorf(open, "unterminated string")
		}
		at := p.pos
		var r rune
		switch c := p.in[p.pos]; {
		case c == '"':
			p.out = append(p.out, '"')
			p.pos++
			return nil
		case c == '\\':
			var err error
			if r, err = p.escape(); err != nil {
				return err
			}
		case c < 0x20:
			return p.errorf(at, "control character U+%04X in string (must be escaped)", c)
		case c < utf8.RuneSelf:
			r = rune(c)
			p.pos++
		default:
			var n int
			r, n = utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && n == 1 {
				return p.errorf(at, "invalid UTF-8 in string")
			}
			p.pos += n
		}
		p.out = appendEscaped(p.out, r)
		if key {
			p.keys = utf8.AppendRune(p.keys, r)
		}
	}
}

// escape reads the escape sequence at p.pos and returns the rune it stands
// for. A \u escape of a UTF-16 surrogate must be a high surrogate followed
// at once by a \u escape of a low one; anything else is a lone surrogate.
func (p *parser) escape() (rune, error) {
	at := p.pos
	if p.pos+1 >= len(p.in) {
		return 0, p.errorf(at, "unterminated escape sequence")
	}
	c := p.in[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, ok := hex4(p.in[p.pos:])
		if !ok {
			return 0, p.errorf(at, "invalid \\u escape, want four hex digits")
		}
		p.pos += 4
		if !utf16IsSurrogate(r) {
			return r, nil
		}
		if r >= 0xdc00 {
			return 0, p.errorf(at, "lone surrogate \\u%04x (a low surrogate without a high one)", r)
		}
		if rest := p.in[p.pos:]; len(rest) >= 6 && rest[0] == '\\' && rest[1] == 'u' {
			if lo, ok := hex4(rest[2:]); ok && 0xdc00 <= lo && lo < 0xe000 {
				p.pos += 6
				return 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00), nil
			}
		}
		return 0, p.errorf(at, "lone surrogate \\u%04x (a high surrogate not followed by a low one)", r)
	}
	return 0, p.errorf(at, "invalid escape sequence: backslash followed by %s", p.describe(at+1))
}

func utf16IsSurrogate(r rune) bool { return 0xd800 <= r && r < 0xe000 }

// hex4 decodes four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// plainByte marks the bytes json.Marshal writes as they are: printable ASCII
// except '"', '\\' and the HTML-significant '<', '>' and '&'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendEscaped appends r as json.Marshal writes it inside a string, so that
// canonical strings hash as they did when json.Marshal wrote them.
func appendEscaped(dst []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	case '<', '>', '&':
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	case '\u2028', '\u2029':
		return append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}

// number reads a JSON number and writes its canonical spelling. The value
// is kept as an exact decimal: sign, significant digits and exponent; see
// idem.CanonicalJSON for the spelling.
func (p *parser) number() error {
	in, at := p.in, p.pos
	i := at
	neg := in[i] == '-'
	if neg {
		i++
	}
	intLo := i
	switch {
	case i < len(in) && in[i] == '0':
		i++
		if i < len(in) && isDigit(in[i]) {
			return p.errorf(at, "number with a leading zero")
		}
	case i < len(in) && isDigit(in[i]):
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	default:
		return p.errorf(at, "invalid number, want a digit after '-'")
	}
	intHi := i
	fracLo, fracHi := i, i
	if i < len(in) && in[i] == '.' {
		i++
		fracLo = i
		for i < len(in) && isDigit(in[i]) {
			i++
		}
		if i == fracLo {
			return p.errorf(at, "invalid number, want a digit after '.'")
		}
		fracHi = i
	}
	var exp int64
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		expNeg := false
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			expNeg = in[i] == '-'
			i++
		}
		expLo := i
		for ; i < len(in) && isDigit(in[i]); i++ {
			// Saturate: past 10^12 the number is out of range anyway (or
			// zero), and the sum below must not overflow.
			if exp < 1e12 {
				exp = exp*10 + int64(in[i]-'0')
			}
		}
		if i == expLo {
			return p.errorf(at, "invalid number, want a digit in the exponent")
		}
		if expNeg {
			exp = -exp
		}
	}
	p.pos = i

	// The significant digits are those of intLo:intHi followed by
	// fracLo:fracHi; d indexes that concatenation.
	nInt, nAll := intHi-intLo, intHi-intLo+fracHi-fracLo
	digit := func(d int) byte {
		if d < nInt {
			return in[intLo+d]
		}
		return in[fracLo+d-nInt]
	}
	first := 0
	for first < nAll && digit(first) == '0' {
		first++
	}
	if first == nAll {
		p.out = append(p.out, '0') // zero has one spelling: no sign, no exponent
		return nil
	}
	last := nAll - 1
	for digit(last) == '0' {
		last--
	}
	// The value is ±0.D × 10^(point), D = digits first..last; sci is the
	// exponent of scientific notation (D[0].D[1:] × 10^sci) and low that of
	// the last significant digit.
	nSig := int64(last - first + 1)
	sci := exp + int64(nInt-1-first)
	if sci > maxExponent || sci < -maxExponent {
		return p.errorf(at, "number out of range (decimal exponent beyond ±%d)", maxExponent)
	}
	low := sci - nSig + 1

	appendDigits := func(dst []byte, lo, hi int) []byte { // digits lo..hi-1
		if lo < nInt {
			dst = append(dst, in[intLo+lo:intLo+min(hi, nInt)]...)
		}
		if hi > nInt {
			dst = append(dst, in[fracLo+max(lo, nInt)-nInt:fracLo+hi-nInt]...)
		}
		return dst
	}
	out := p.out
	if neg {
		out = append(out, '-')
	}
	switch {
	case low >= 0 && low <= maxPlainZeros: // an integer, plain
		out = appendDigits(out, first, last+1)
		for range low {
			out = append(out, '0')
		}
	case low < 0 && sci >= 0 && sci < 6: // a fraction, plain: 123456.5
		point := first + int(sci) + 1
		out = appendDigits(out, first, point)
		out = append(out, '.')
		out = appendDigits(out, point, last+1)
	case low < 0 && sci < 0 && sci >= -4: // a fraction, plain: 0.0001
		out = append(out, '0', '.')
		for range -sci - 1 {
			out = append(out, '0')
		}
		out = appendDigits(out, first, last+1)
	default: // scientific: 1.5e+300, 1e-07
		out = append(out, digit(first))
		if nSig > 1 {
			out = append(out, '.')
			out = appendDigits(out, first+1, last+1)
		}
		out = append(out, 'e')
		if sci < 0 {
			out = append(out, '-')
			sci = -sci
		} else {
			out = append(out, '+')
		}
		if sci < 10 {
			out = append(out, '0')
		}
		out = strconv.AppendInt(out, sci, 10)
	}
	p.out = out
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// emit appends out[a:b] to dst with the recorded objects objs[lo:hi] (all
// inside that span) written with their members in canonical order.
func (p *parser) emit(dst []byte, a, b, lo, hi int) []byte {
	for i := lo; i < hi; {
		o := p.objs[i]
		dst = append(dst, p.out[a:o.start]...)
		dst = append(dst, '{')
		for j, m := range p.mems[o.memLo:o.memHi] {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = p.emit(dst, m.start, m.end, m.objLo, m.objHi)
		}
		dst = append(dst, '}')
		a, i = o.end, o.next
	}
	return append(dst, p.out[a:b]...)
}
