// Command kvcm is kvcm's command-line tool: demos, benchmarks and the serving
// simulator, one subcommand each.
//
//	kvcm bench migrate   codec throughput against the contiguous-copy limit
//	kvcm bench bookkeeping  the manager's CPU cost per request and decode step
//	kvcm bench disk      the disk tier's throughput against raw O_DIRECT
//	kvcm bench shared    the shared tier against the Redis Cluster's raw SET/GET
//	kvcm demo [flags]    serve a shared-prefix workload and check every reused byte
//	kvcm simulate        the CP-aware scheduling simulator
//	kvcm help [command]  describe a command
//
// Each subcommand lives in its own file and registers itself in commands.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// command is one subcommand. setup registers the command's flags on fs and
// returns the function that runs it once the flags are parsed; it returns the
// process exit status.
type command struct {
	name     string
	summary  string // one line, for the command list
	synopsis string // a paragraph, for kvcm help <command>
	setup    func(fs *flag.FlagSet) func(stdout, stderr io.Writer) int
	// main, if set, runs the command with its raw arguments instead: for
	// commands with subcommands of their own.
	main func(args []string, stdout, stderr io.Writer) int
}

// commands is the subcommand table. Keep it sorted by name.
var commands = []command{
	benchCommand,
	demoCommand,
	simulateCommand,
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and found a problem, or failed
	exitUsage = 2 // bad command line
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			usage(stdout)
			return exitOK
		}
		c, ok := lookup(rest[0])
		if !ok {
			fmt.Fprintf(stderr, "kvcm: unknown command %q\n", rest[0])
			usage(stderr)
			return exitUsage
		}
		fs := newFlagSet(c)
		c.setup(fs)
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "kvcm: unknown command %q\n", name)
		usage(stderr)
		return exitUsage
	}
	if c.main != nil {
		return c.main(rest, stdout, stderr)
	}
	fs := newFlagSet(c)
	runCmd := c.setup(fs)
	fs.SetOutput(stderr)
	if err := fs.Parse(rest); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvcm %s: unexpected arguments: %s\n", c.name, strings.Join(fs.Args(), " "))
		return exitUsage
	}
	return runCmd(stdout, stderr)
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvcm <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "  help       describe a command: kvcm help <command>")
}

// newFlagSet returns a flag set whose usage describes c.
func newFlagSet(c command) *flag.FlagSet {
	fs := flag.NewFlagSet("kvcm "+c.name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kvcm %s [flags]\n\n%s\n\nflags:\n", c.name, c.synopsis)
		fs.PrintDefaults()
	}
	return fs
}
