package mcpgate

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// pointer is a JSON pointer (RFC 6901) parsed into its reference tokens.
type pointer struct {
	text   string
	tokens []string
}

// parsePointer parses "" (the whole document) or "/a/b~1c/0".
func parsePointer(s string) (pointer, error) {
	if s == "" {
		return pointer{}, nil
	}
	if !strings.HasPrefix(s, "/") {
		return pointer{}, fmt.Errorf("%q is not a JSON pointer: it must start with /, as /to", s)
	}
	parts := strings.Split(s[1:], "/")
	for i, p := range parts {
		if strings.Contains(strings.ReplaceAll(strings.ReplaceAll(p, "~0", ""), "~1", ""), "~") {
			return pointer{}, fmt.Errorf("%q is not a JSON pointer: ~ must be ~0 or ~1", s)
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	return pointer{text: s, tokens: parts}, nil
}

// find returns the value the pointer names in doc, a JSON value decoded
// into json.RawMessage members. It walks the raw text, so numbers and
// strings come back exactly as the caller wrote them.
func (p pointer) find(doc json.RawMessage) (json.RawMessage, bool) {
	cur := doc
	for _, tok := range p.tokens {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(cur, &obj); err == nil {
			v, ok := obj[tok]
			if !ok {
				return nil, false
			}
			cur = v
			continue
		}
		var arr []json.RawMessage
		if err := json.Unmarshal(cur, &arr); err != nil {
			return nil, false
		}
		i, err := strconv.Atoi(tok)
		if err != nil || i < 0 || i >= len(arr) || (len(tok) > 1 && tok[0] == '0') {
			return nil, false
		}
		cur = arr[i]
	}
	return cur, true
}
