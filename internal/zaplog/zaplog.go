// Package zaplog builds the zap logger both programs use: JSON for production, console for development,
// at a level given by name.
package zaplog

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger at level ("debug", "info", "warn", "error").
func New(level string, development bool) (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	if development {
		zc = zap.NewDevelopmentConfig()
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	return zc.Build()
}
