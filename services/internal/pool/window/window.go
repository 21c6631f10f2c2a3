// SPDX-License-Identifier: Apache-2.0

// Package window says when a KubeletConfigPool's maintenance windows are open: whether one is open at a
// given time, when it closes, and when the next one opens. It is pure, so every rule (days, a window
// across midnight, time zones and their daylight-saving changes, overlapping windows) is a table row.
//
// A window opens on each of its days (in its time zone) at its start, and stays open for its duration,
// which may run into the next day. Windows that overlap or touch are one stretch of open time: a pool
// assigns through all of it.
package window

import (
	"fmt"
	"slices"
	"time"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Schedule is a pool's windows, parsed.
type Schedule struct {
	windows []parsed
}

type parsed struct {
	days     [7]bool // by time.Weekday
	hour     int
	minute   int
	duration time.Duration
	loc      *time.Location
}

// weekdays are the spellings of v1alpha1.MaintenanceWindow.Days.
var weekdays = map[string]time.Weekday{
	"Sun": time.Sunday, "Mon": time.Monday, "Tue": time.Tuesday, "Wed": time.Wednesday,
	"Thu": time.Thursday, "Fri": time.Friday, "Sat": time.Saturday,
}

// MaxDuration is the longest window: a week, which with every day listed is always open.
const MaxDuration = 7 * 24 * time.Hour

// Parse checks the windows and parses them. The schema already checks the forms of days, start and
// duration; the time zone can only be checked against the time zone database, here. An error names the
// window by its index, as spec.maintenanceWindows[i].
func Parse(ws []v1alpha1.MaintenanceWindow) (Schedule, error) {
	var s Schedule
	for i, w := range ws {
		p, err := parse(w)
		if err != nil {
			return Schedule{}, fmt.Errorf("spec.maintenanceWindows[%d]: %w", i, err)
		}
		s.windows = append(s.windows, p)
	}
	return s, nil
}

func parse(w v1alpha1.MaintenanceWindow) (parsed, error) {
	var p parsed
	if len(w.Days) == 0 {
		p.days = [7]bool{true, true, true, true, true, true, true}
	}
	for _, d := range w.Days {
		wd, ok := weekdays[string(d)]
		if !ok {
			return parsed{}, fmt.Errorf("days: %q is not one of Mon, Tue, Wed, Thu, Fri, Sat, Sun", d)
		}
		p.days[wd] = true
	}
	start, err := time.Parse("15:04", w.Start)
	if err != nil {
		return parsed{}, fmt.Errorf("start %q is not a time of day HH:MM", w.Start)
	}
	p.hour, p.minute = start.Hour(), start.Minute()
	p.duration = w.Duration.Duration
	if p.duration <= 0 || p.duration > MaxDuration {
		return parsed{}, fmt.Errorf("duration %v must be more than 0 and at most %v", p.duration, MaxDuration)
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	// "Local" would be the time zone of whichever machine runs dkc-server.
	if tz == "Local" {
		return parsed{}, fmt.Errorf(`timeZone "Local" is not a time zone: name one, e.g. "Europe/Berlin"`)
	}
	if p.loc, err = time.LoadLocation(tz); err != nil {
		return parsed{}, fmt.Errorf("timeZone %q: %w", tz, err)
	}
	return p, nil
}

// Empty says whether the pool has no windows: then it is always open.
func (s Schedule) Empty() bool { return len(s.windows) == 0 }

// State is where a time stands with a schedule.
type State struct {
	// Open: a window is open.
	Open bool
	// Close is when the open stretch ends (zero when closed, or when it never does).
	Close time.Time
	// Next is when the next window opens after now (after the open stretch, when open); zero when none
	// does (no windows, or one always open).
	Next time.Time
}

// At is the schedule's state at now. Without windows it is always open.
func (s Schedule) At(now time.Time) State {
	if s.Empty() {
		return State{Open: true}
	}
	spans := s.spans(now)
	for i, sp := range spans {
		switch {
		case !now.Before(sp.end):
			continue
		case now.Before(sp.start):
			return State{Next: sp.start}
		default:
			st := State{Open: true, Close: sp.end}
			if i+1 < len(spans) {
				st.Next = spans[i+1].start
			}
			if sp.end.Sub(now) > 2*MaxDuration {
				st.Close = time.Time{} // open for good: every day, windows of a day or longer
			}
			return st
		}
	}
	return State{} // unreachable: a window opens at least once a week
}

type span struct{ start, end time.Time }

// spans are the windows' openings from before now, early enough to include any still open, to well after
// the next one, merged where they overlap or touch, in time order.
func (s Schedule) spans(now time.Time) []span {
	var out []span
	for _, w := range s.windows {
		local := now.In(w.loc)
		// Openings on the days from 8 before now (a week-long window opened then is still open) to 15
		// after (the next one after an open stretch of up to a week).
		for d := -8; d <= 15; d++ {
			day := time.Date(local.Year(), local.Month(), local.Day()+d, 0, 0, 0, 0, w.loc)
			if !w.days[day.Weekday()] {
				continue
			}
			// A start that a daylight-saving change skips or repeats (02:30 on the night the clocks change)
			// opens at one of its two readings, which time.Date picks: within the hour either way.
			start := time.Date(day.Year(), day.Month(), day.Day(), w.hour, w.minute, 0, 0, w.loc)
			out = append(out, span{start: start, end: start.Add(w.duration)})
		}
	}
	slices.SortFunc(out, func(a, b span) int { return a.start.Compare(b.start) })
	merged := out[:0]
	for _, sp := range out {
		if n := len(merged); n > 0 && !sp.start.After(merged[n-1].end) {
			if sp.end.After(merged[n-1].end) {
				merged[n-1].end = sp.end
			}
			continue
		}
		merged = append(merged, sp)
	}
	return merged
}
