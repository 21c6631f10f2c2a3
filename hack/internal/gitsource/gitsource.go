// SPDX-License-Identifier: Apache-2.0

// Package gitsource answers what the build programs under hack/ (images, release) ask of the checkout they
// build: git's answers, and the time their outputs carry so that a commit rebuilds to the same bytes.
package gitsource

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Git runs git with args in the current directory and returns its trimmed output; a failure names the
// command and carries git's own message.
func Git(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", args...).Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ": " + strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("git %s: %w%s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out)), nil
}

// Created is the time reproducible outputs carry: $SOURCE_DATE_EPOCH, else HEAD's commit time, in UTC.
func Created(ctx context.Context) (time.Time, error) {
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		var err error
		if epoch, err = Git(ctx, "log", "-1", "--format=%ct", "HEAD"); err != nil {
			return time.Time{}, err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamp %q (SOURCE_DATE_EPOCH or HEAD's commit time): %w", epoch, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}
