// Package mcpgate is a gateway between an MCP host and an MCP server that
// makes each tools/call an intent: claimed once, its result stored and
// replayed to every re-issued call, a dead call decided by the tool's
// recovery. MCP request ids are unique only among open requests and a
// broken stream's call is re-issued under a new one, so neither the host
// nor the server can tell a retry from a new call; the gateway can,
// because it keys the call by run, step, tool and the arguments the
// tool's policy names.
//
// It lives in a module of its own so that the core does not depend on
// the MCP SDK.
package mcpgate
