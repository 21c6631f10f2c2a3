// SPDX-License-Identifier: Apache-2.0

// Package zaplog builds the zap logger both programs use: JSON for production, console for development,
// at a level given by name.
package zaplog

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger at level ("debug", "info", "warn", "error"); at debug, no line is sampled away.
func New(level string, development bool) (*zap.Logger, error) {
	return build(level, development, nil)
}

// build is New writing to paths instead of stderr, when given.
func build(level string, development bool, paths []string) (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	if development {
		zc = zap.NewDevelopmentConfig()
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	if paths != nil {
		zc.OutputPaths, zc.ErrorOutputPaths = paths, paths
	}
	if lvl == zapcore.DebugLevel {
		// Production sampling keeps the first 100 lines of a message per second and then every 100th: in
		// a reconnect storm that drops most nodes' lines. Whoever asks for debug is following nodes.
		zc.Sampling = nil
	}
	return zc.Build()
}
