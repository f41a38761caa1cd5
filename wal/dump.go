package wal

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
)

// DumpOptions configure Dump.
type DumpOptions struct {
	After uint64 // print entries with sequence above After
	JSON  bool   // one JSON object per line instead of tab-separated text
	// Decode renders an entry's bytes as a JSON-encodable value (the
	// supervisor passes a MessagePack decoder). When nil or when it fails,
	// the bytes are printed in hex.
	Decode func(data []byte) (any, error)
}

// Dump prints the entries of the log in dir above o.After, read-only and
// safe while a supervisor runs (it uses ReadDir). Text lines are
// "SEQUENCE<TAB>SIZE<TAB>VALUE" where VALUE is the decoded entry as JSON or
// "hex:" and the bytes; JSON lines are {"sequence", "size", "entry"} or
// {"sequence", "size", "data_hex"}. It returns the number of entries printed
// and the error that stopped it (a *CorruptionError after the good prefix,
// or a write error).
func Dump(w io.Writer, dir string, o DumpOptions) (int, error) {
	n := 0
	enc := json.NewEncoder(w)
	err := ReadDir(dir, o.After, func(e Entry) error {
		var v any
		decoded := false
		if o.Decode != nil {
			if d, err := o.Decode(e.Data); err == nil {
				if _, err := json.Marshal(d); err == nil {
					v, decoded = d, true
				}
			}
		}
		var err error
		switch {
		case o.JSON && decoded:
			err = enc.Encode(struct {
				Sequence uint64 `json:"sequence"`
				Size     int    `json:"size"`
				Entry    any    `json:"entry"`
			}{e.Sequence, len(e.Data), v})
		case o.JSON:
			err = enc.Encode(struct {
				Sequence uint64 `json:"sequence"`
				Size     int    `json:"size"`
				DataHex  string `json:"data_hex"`
			}{e.Sequence, len(e.Data), hex.EncodeToString(e.Data)})
		case decoded:
			b, _ := json.Marshal(v)
			_, err = fmt.Fprintf(w, "%d\t%d\t%s\n", e.Sequence, len(e.Data), b)
		default:
			_, err = fmt.Fprintf(w, "%d\t%d\thex:%x\n", e.Sequence, len(e.Data), e.Data)
		}
		if err != nil {
			return fmt.Errorf("wal: dump: %w", err)
		}
		n++
		return nil
	})
	return n, err
}
