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
