// SPDX-License-Identifier: Apache-2.0

package window

import (
	"strings"
	"testing"
	"time"
	// The zones compiled in, as dkc-server ships them: the tests do not read the host's zoneinfo, which
	// Go's test cache could not see change.
	_ "time/tzdata"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

func w(days, start string, d time.Duration, tz string) v1alpha1.MaintenanceWindow {
	mw := v1alpha1.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: tz}
	for _, day := range strings.Fields(days) {
		mw.Days = append(mw.Days, v1alpha1.Weekday(day))
	}
	return mw
}

// at parses an RFC 3339 time; "" is the zero time.
func at(t *testing.T, s string) time.Time {
	t.Helper()
	if s == "" {
		return time.Time{}
	}
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAt(t *testing.T) {
	// 2026-11-26 is a Thursday.
	for _, tc := range []struct {
		name    string
		windows []v1alpha1.MaintenanceWindow
		now     string
		open    bool
		close   string
		next    string
	}{
		{name: "no windows: always open", now: "2026-11-26T12:00:00Z", open: true},
		{name: "every day, inside", windows: []v1alpha1.MaintenanceWindow{w("", "02:00", 4*time.Hour, "")},
			now: "2026-11-26T03:00:00Z", open: true, close: "2026-11-26T06:00:00Z", next: "2026-11-27T02:00:00Z"},
		{name: "every day, at the opening minute: open", windows: []v1alpha1.MaintenanceWindow{w("", "02:00", 4*time.Hour, "")},
			now: "2026-11-26T02:00:00Z", open: true, close: "2026-11-26T06:00:00Z", next: "2026-11-27T02:00:00Z"},
		{name: "every day, at the closing minute: closed", windows: []v1alpha1.MaintenanceWindow{w("", "02:00", 4*time.Hour, "")},
			now: "2026-11-26T06:00:00Z", next: "2026-11-27T02:00:00Z"},
		{name: "every day, before it", windows: []v1alpha1.MaintenanceWindow{w("", "14:00", time.Hour, "")},
			now: "2026-11-26T12:00:00Z", next: "2026-11-26T14:00:00Z"},
		{name: "across midnight: open the next morning", windows: []v1alpha1.MaintenanceWindow{w("Wed", "23:00", 2*time.Hour, "")},
			now: "2026-11-26T00:30:00Z", open: true, close: "2026-11-26T01:00:00Z", next: "2026-12-02T23:00:00Z"},
		{name: "weekends only, on a Thursday", windows: []v1alpha1.MaintenanceWindow{w("Sat Sun", "02:00", 4*time.Hour, "")},
			now: "2026-11-26T12:00:00Z", next: "2026-11-28T02:00:00Z"},
		{name: "weekends only, Saturday's open: next is Sunday's", windows: []v1alpha1.MaintenanceWindow{w("Sat Sun", "02:00", 4*time.Hour, "")},
			now: "2026-11-28T05:00:00Z", open: true, close: "2026-11-28T06:00:00Z", next: "2026-11-29T02:00:00Z"},
		{name: "in its time zone: 02:00 in Berlin is 01:00 UTC in winter", windows: []v1alpha1.MaintenanceWindow{w("", "02:00", time.Hour, "Europe/Berlin")},
			now: "2026-11-26T00:00:00Z", next: "2026-11-26T01:00:00Z"},
		{name: "the day is the time zone's: Friday 00:30 in Tokyo is Thursday UTC", windows: []v1alpha1.MaintenanceWindow{w("Fri", "00:30", time.Hour, "Asia/Tokyo")},
			now: "2026-11-26T12:00:00Z", next: "2026-11-26T15:30:00Z"},
		{name: "the duration is elapsed time across a daylight-saving change", windows: []v1alpha1.MaintenanceWindow{w("Sun", "00:00", 4*time.Hour, "Europe/Berlin")},
			now: "2026-10-25T01:00:00Z", open: true, close: "2026-10-25T02:00:00Z", next: "2026-10-31T23:00:00Z"},
		{name: "overlapping windows are one stretch", windows: []v1alpha1.MaintenanceWindow{w("", "01:00", 2*time.Hour, ""), w("", "02:00", 2*time.Hour, "")},
			now: "2026-11-26T02:30:00Z", open: true, close: "2026-11-26T04:00:00Z", next: "2026-11-27T01:00:00Z"},
		{name: "touching windows are one stretch", windows: []v1alpha1.MaintenanceWindow{w("", "01:00", time.Hour, ""), w("", "02:00", time.Hour, "")},
			now: "2026-11-26T01:30:00Z", open: true, close: "2026-11-26T03:00:00Z", next: "2026-11-27T01:00:00Z"},
		{name: "the soonest of two windows is next", windows: []v1alpha1.MaintenanceWindow{w("Mon", "01:00", time.Hour, ""), w("Fri", "22:00", time.Hour, "")},
			now: "2026-11-26T12:00:00Z", next: "2026-11-27T22:00:00Z"},
		{name: "a week-long window opened days ago", windows: []v1alpha1.MaintenanceWindow{w("Mon", "00:00", 100*time.Hour, "")},
			now: "2026-11-26T12:00:00Z", open: true, close: "2026-11-27T04:00:00Z", next: "2026-11-30T00:00:00Z"},
		{name: "every day for a day: open for good", windows: []v1alpha1.MaintenanceWindow{w("", "00:00", 24*time.Hour, "")},
			now: "2026-11-26T12:00:00Z", open: true},
		{name: "one day a week for a week: open for good", windows: []v1alpha1.MaintenanceWindow{w("Mon", "06:00", MaxDuration, "")},
			now: "2026-11-26T12:00:00Z", open: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.windows)
			if err != nil {
				t.Fatal(err)
			}
			got := s.At(at(t, tc.now))
			want := State{Open: tc.open, Close: at(t, tc.close), Next: at(t, tc.next)}
			if got.Open != want.Open || !got.Close.Equal(want.Close) || !got.Next.Equal(want.Next) {
				t.Errorf("At(%s) = open %v, close %v, next %v; want open %v, close %v, next %v", tc.now,
					got.Open, got.Close.UTC(), got.Next.UTC(), want.Open, want.Close.UTC(), want.Next.UTC())
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window v1alpha1.MaintenanceWindow
		err    string
	}{
		{name: "a day misspelt", window: w("Saturday", "02:00", time.Hour, ""), err: `spec.maintenanceWindows[0]: days: "Saturday" is not one of Mon`},
		{name: "a start that is no time of day", window: w("", "25:00", time.Hour, ""), err: `start "25:00" is not a time of day HH:MM`},
		{name: "no duration", window: w("", "02:00", 0, ""), err: "duration 0s must be more than 0 and at most 168h0m0s"},
		{name: "longer than a week", window: w("", "02:00", MaxDuration+time.Minute, ""), err: "must be more than 0 and at most 168h0m0s"},
		{name: "a time zone the database does not know", window: w("", "02:00", time.Hour, "Europe/Atlantis"), err: `timeZone "Europe/Atlantis": unknown time zone`},
		{name: "Local is dkc-server's machine's zone", window: w("", "02:00", time.Hour, "Local"), err: `timeZone "Local" is not a time zone`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]v1alpha1.MaintenanceWindow{tc.window})
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse: %v, want an error with %q", err, tc.err)
			}
		})
	}
}
