// Package agentpython holds the test of the Python agent example,
// agent.py: an agent run of five tool calls, killed with SIGKILL at every
// step boundary and inside each call, resumed, each effect once. See
// README.md.
package agentpython
