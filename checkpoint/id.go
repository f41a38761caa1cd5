package checkpoint

import (
	"fmt"

	"github.com/google/uuid"
)

// ParseID returns the canonical (lower-case, hyphenated) form of a checkpoint
// id. Only the 36-character hyphenated UUID form is accepted, in either case;
// anything else — a path, "../x", braces, a URN, the 32-digit form, stray
// spaces — returns an error wrapping [ErrInvalidID]. Every method of [Store]
// that takes an id checks it with ParseID, so an id can never name a file
// outside the store.
func ParseID(s string) (string, error) {
	if len(s) != 36 {
		return "", fmt.Errorf("%w: %q is not a UUID (want the form 0190a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b)", ErrInvalidID, s)
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrInvalidID, s, err)
	}
	return u.String(), nil
}

func fileName(id string) string { return id + ckptSuffix }
func pinName(id string) string  { return id + pinSuffix }
func badName(id string) string  { return id + badSuffix }
