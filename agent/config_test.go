package agent_test

import (
	"testing"

	"github.com/agent-sidecar/supervisor/agent"
)

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want agent.Config
	}{
		{"nothing set gives defaults", nil,
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "stdio"}},
		{"everything set", map[string]string{
			agent.EnvRole: "shadow", agent.EnvProtocolVersion: "2", agent.EnvTransport: "fd", agent.EnvRestorePending: "1"},
			agent.Config{Role: "shadow", ProtocolVersion: 2, Transport: "fd", RestorePending: true}},
		{"restore not pending", map[string]string{agent.EnvRestorePending: "0"},
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "stdio"}},
		{"unparsable version keeps the default", map[string]string{agent.EnvProtocolVersion: "two"},
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "stdio"}},
		{"version 1", map[string]string{agent.EnvProtocolVersion: " 1 "},
			agent.Config{Role: "primary", ProtocolVersion: 1, Transport: "stdio"}},
		{"empty values keep defaults", map[string]string{agent.EnvRole: "", agent.EnvTransport: " "},
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "stdio"}},
		{"unknown transport is kept for Connect to reject", map[string]string{agent.EnvTransport: "tcp"},
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "tcp"}},
		{"unparsable restore flag is false", map[string]string{agent.EnvRestorePending: "maybe"},
			agent.Config{Role: "primary", ProtocolVersion: 2, Transport: "stdio"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{agent.EnvRole, agent.EnvProtocolVersion, agent.EnvTransport, agent.EnvRestorePending} {
				t.Setenv(k, "")
			}
			unsetAll(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			if got := agent.ConfigFromEnv(); got != tt.want {
				t.Errorf("ConfigFromEnv() = %+v, want %+v", got, tt.want)
			}
		})
	}
}
