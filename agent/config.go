package agent

import (
	"os"
	"strconv"
	"strings"
)

// Environment variables the supervisor sets for the agent it spawns.
const (
	EnvRole            = "SUPERVISOR_ROLE"             // "primary" or "shadow"
	EnvProtocolVersion = "SUPERVISOR_PROTOCOL_VERSION" // highest protocol version the supervisor speaks
	EnvTransport       = "SUPERVISOR_TRANSPORT"        // "stdio" or "fd"
	EnvRestorePending  = "SUPERVISOR_RESTORE_PENDING"  // "1": a restore is the first frame the agent will read
)

// Roles.
const (
	RolePrimary = "primary"
	RoleShadow  = "shadow"
)

// Transports.
const (
	// TransportStdio: the agent reads frames on stdin and writes them on stdout.
	// Stdout is not free for logs; log to stderr.
	TransportStdio = "stdio"
	// TransportFD: the agent reads frames on fd 3 and writes them on fd 4.
	// Stdout and stderr are both free for logs.
	TransportFD = "fd"
)

// DefaultProtocolVersion is the protocol version spoken when nothing else is said.
const DefaultProtocolVersion = 2

// Config is what the supervisor tells the agent through its environment.
type Config struct {
	Role            string // RolePrimary or RoleShadow
	ProtocolVersion int    // the supervisor's protocol version
	Transport       string // TransportStdio or TransportFD
	// RestorePending reports that the supervisor will send a restore as the
	// very first frame. An agent that sees it should not change its state
	// (or log WAL entries) before that restore has been applied.
	RestorePending bool
}

// ConfigFromEnv reads [Config] from the SUPERVISOR_* environment variables.
// Missing or unparsable values take their defaults: role primary, protocol
// version 2, transport stdio, no restore pending. Values are not validated
// here; [Connect] rejects a transport it does not know.
func ConfigFromEnv() Config {
	return configFromLookup(os.LookupEnv)
}

func configFromLookup(lookup func(string) (string, bool)) Config {
	cfg := Config{Role: RolePrimary, ProtocolVersion: DefaultProtocolVersion, Transport: TransportStdio}
	if v, ok := lookup(EnvRole); ok && strings.TrimSpace(v) != "" {
		cfg.Role = strings.TrimSpace(v)
	}
	if v, ok := lookup(EnvProtocolVersion); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			cfg.ProtocolVersion = n
		}
	}
	if v, ok := lookup(EnvTransport); ok && strings.TrimSpace(v) != "" {
		cfg.Transport = strings.TrimSpace(v)
	}
	if v, ok := lookup(EnvRestorePending); ok {
		if b, err := strconv.ParseBool(strings.TrimSpace(v)); err == nil {
			cfg.RestorePending = b
		}
	}
	return cfg
}
