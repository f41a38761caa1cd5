package replica

import "errors"

// Errors callers branch on. Every error of this package wraps at most one
// of them; [Kind] names it for metrics.
var (
	// ErrBadURL: the replica URL or endpoint does not parse.
	ErrBadURL = errors.New("replica: bad location")
	// ErrAuth: the server refused the credentials or the access.
	ErrAuth = errors.New("replica: access denied")
	// ErrBucket: the bucket does not exist (or the region is wrong).
	ErrBucket = errors.New("replica: bucket unavailable")
	// ErrFull: the store refused an upload for lack of space: the drive is
	// full or a bucket quota is reached (retried; an operator must free
	// space or raise the quota).
	ErrFull = errors.New("replica: object store full")
	// ErrNetwork: the server could not be reached or failed (retried).
	ErrNetwork = errors.New("replica: server unreachable")
	// ErrNotFound: an object is missing.
	ErrNotFound = errors.New("replica: object not found")
	// ErrCorrupt: an object's bytes do not match its checksum, or do not
	// parse. A corrupt object is never served.
	ErrCorrupt = errors.New("replica: object is corrupt")
	// ErrEmpty: the replica holds no generation (nothing to restore).
	ErrEmpty = errors.New("replica: holds nothing")
	// ErrNoTarget: no restore to the asked point exists without a gap.
	ErrNoTarget = errors.New("replica: no complete restore to that point")
)

// Kind names the error's kind for supervisor_replica_errors_total:
// network, full, auth, bucket, corrupt or other.
func Kind(err error) string {
	switch {
	case errors.Is(err, ErrFull):
		return "full"
	case errors.Is(err, ErrNetwork):
		return "network"
	case errors.Is(err, ErrAuth):
		return "auth"
	case errors.Is(err, ErrBucket):
		return "bucket"
	case errors.Is(err, ErrCorrupt):
		return "corrupt"
	}
	return "other"
}
