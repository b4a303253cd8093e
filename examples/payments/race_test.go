//go:build race

package main

// raceEnabled builds the example under test with the race detector too.
const raceEnabled = true
