package main

// --log-format and --log-level of the long-running commands (moat serve,
// moat mcp): the log is slog's, as text (the default, for a terminal and
// journald) or as JSON lines (for a log shipper).

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

var (
	logFormats = []string{"text", "json"}
	logLevels  = []string{"debug", "info", "warn", "error"}
)

type logFlags struct {
	format, level *string
}

func addLogFlags(fs *flag.FlagSet) logFlags {
	return logFlags{
		format: fs.String("log-format", "text", "log `FORMAT`: text (key=value) or json (one object per line)"),
		level:  fs.String("log-level", "info", "least severe `LEVEL` logged: debug, info, warn or error (debug adds refused requests and health checks)"),
	}
}

// logger returns the logger the flags ask for, writing to w. where names
// a flag's source in an error (settingSources.of; nil: the flag).
func (l logFlags) logger(w io.Writer, where func(string) string) (*slog.Logger, error) {
	if where == nil {
		where = func(name string) string { return "--" + name }
	}
	levels := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	level, ok := levels[strings.ToLower(*l.level)]
	if !ok {
		return nil, fmt.Errorf("%s %q: want one of %s", where("log-level"), *l.level, strings.Join(logLevels, ", "))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(*l.format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%s %q: want one of %s", where("log-format"), *l.format, strings.Join(logFormats, ", "))
}
