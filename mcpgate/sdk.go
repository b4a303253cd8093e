package mcpgate

import "github.com/modelcontextprotocol/go-sdk/mcp"

// implementation names the gateway to both sides of the connection.
var implementation = &mcp.Implementation{Name: "once-mcp", Version: "0.1.0"}
