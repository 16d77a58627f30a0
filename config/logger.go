package config

import (
	"io"
	"log/slog"
)

// Logger returns the logger on w that log.level and log.format (validated
// by Load) describe: the CLI's and an embedding library's alike.
func (l LogConfig) Logger(w io.Writer) *slog.Logger {
	lvl := slog.LevelWarn
	switch l.Level {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "error":
		lvl = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
