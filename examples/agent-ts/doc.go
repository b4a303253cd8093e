// Package agentts holds the test of the TypeScript agent example,
// src/agent.ts: an agent run of five tool calls, killed with SIGKILL at
// every step boundary and inside each call, resumed, each effect once.
// See README.md.
package agentts
