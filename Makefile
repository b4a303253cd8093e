# The targets are the commands the README shows.
.PHONY: test bench fuzz

test:
	go test -race -count=1 ./...

bench:
	go test -run '^$$' -bench . ./postgres/ ./sqlite/

fuzz:
	go test -run '^$$' -fuzz FuzzKey -fuzztime 30s .
