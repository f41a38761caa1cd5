package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStringCutsOnARuneBoundary(t *testing.T) {
	s := strings.Repeat("é", 10) // 2 bytes each
	for n := 0; n <= len(s)+1; n++ {
		got := String(s, n)
		if !utf8.ValidString(got) {
			t.Fatalf("String(%d) = %q: invalid UTF-8", n, got)
		}
		if n >= len(s) {
			if got != s {
				t.Fatalf("String(%d) = %q, want it whole", n, got)
			}
			continue
		}
		if !strings.HasSuffix(got, "…(20 bytes)") {
			t.Fatalf("String(%d) = %q: no length marker", n, got)
		}
		if body := strings.TrimSuffix(got, "…(20 bytes)"); len(body) > n {
			t.Fatalf("String(%d) kept %d bytes", n, len(body))
		}
	}
	if got := Bytes([]byte("abcdef"), 3); got != "abc…(6 bytes)" {
		t.Fatalf("Bytes = %q", got)
	}
}

func TestInvalidUTF8IsEscaped(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"é ok", "é ok"},
		{"a\xffb", `a\xffb`},
		{"\xc3", `\xc3`},                 // a rune cut short
		{"\xed\xa0\x80", `\xed\xa0\x80`}, // a surrogate: not UTF-8
		{"x\xc3\xa9\x80", `xé\x80`},
		{"\uFFFD", "\uFFFD"}, // a real replacement character stays
	} {
		if got := Valid(tc.in); got != tc.want {
			t.Errorf("Valid(%q) = %q, want %q", tc.in, got, tc.want)
		}
		for _, got := range []string{String(tc.in, 100), Bytes([]byte(tc.in), 100), String(tc.in+strings.Repeat("\xfe", 50), 20)} {
			if !utf8.ValidString(got) {
				t.Errorf("%q: invalid UTF-8 in %q", tc.in, got)
			}
		}
	}
}
