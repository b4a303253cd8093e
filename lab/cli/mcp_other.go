//go:build !linux

package cli

import "os/exec"

// diesWithGateway has no portable form off Linux: there an upstream
// that outlives a killed gateway may finish its call late (see
// mcp_linux.go), and mcpgate/README.md says so.
func diesWithGateway(*exec.Cmd) {}
