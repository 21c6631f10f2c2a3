// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// exposition is a scrape of the apiserver's /metrics in the text format, from only the lines a test needs:
// the TYPE lines, so that histograms parse as histograms, and then the samples.
func exposition(samples ...string) string {
	return strings.Join(append([]string{
		"# TYPE apiserver_request_total counter",
		"# TYPE apiserver_longrunning_requests gauge",
		"# TYPE apiserver_flowcontrol_dispatched_requests_total counter",
		"# TYPE apiserver_flowcontrol_rejected_requests_total counter",
		"# TYPE apiserver_flowcontrol_request_wait_duration_seconds histogram",
		"# TYPE apiserver_flowcontrol_request_execution_seconds histogram",
		"# TYPE apiserver_storage_consistency_checks_total counter",
		"# TYPE apiserver_request_duration_seconds histogram",
		"# TYPE apiserver_response_sizes histogram",
		"# TYPE apiserver_watch_events_total counter",
		"# TYPE apiserver_watch_events_sizes histogram",
		"# TYPE apiserver_init_events_total counter",
		"# TYPE apiserver_storage_list_total counter",
		"# TYPE apiserver_storage_list_fetched_objects_total counter",
		"# TYPE apiserver_storage_list_returned_objects_total counter",
		"# TYPE etcd_requests_total counter",
		"# TYPE etcd_request_duration_seconds histogram",
	}, samples...), "\n") + "\n"
}

// requests is an apiserver_request_total sample.
func requests(verb, resource, subresource, code string, n float64) string {
	return fmt.Sprintf(`apiserver_request_total{code=%q,component="apiserver",dry_run="",group="",resource=%q,scope="cluster",subresource=%q,verb=%q,version="v1"} %g`,
		code, resource, subresource, verb, n)
}

// histogramLines is the _sum and _count lines of one series of a histogram (no buckets: the breakdown reads
// neither).
func histogramLines(name, labels string, sum, count float64) string {
	return fmt.Sprintf("%s_bucket{%s,le=\"+Inf\"} %g\n%s_sum{%s} %g\n%s_count{%s} %g", name, labels, count, name, labels, sum, name, labels, count)
}

func requestLabels(verb, resource, subresource string) string {
	return fmt.Sprintf(`component="apiserver",dry_run="",group="",resource=%q,scope="cluster",subresource=%q,verb=%q,version="v1"`, resource, subresource, verb)
}

func TestBreakdown(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []string
		want          apiserverBreakdown
	}{
		{
			name: "nothing happened",
			before: []string{requests("LIST", "nodes", "", "200", 2),
				histogramLines("apiserver_request_duration_seconds", requestLabels("LIST", "nodes", ""), 1, 2)},
			after: []string{requests("LIST", "nodes", "", "200", 2),
				histogramLines("apiserver_request_duration_seconds", requestLabels("LIST", "nodes", ""), 1, 2)},
			want: apiserverBreakdown{},
		},
		{
			name: "requests by verb, resource and subresource, other labels summed, sorted by handling time",
			before: []string{
				requests("LIST", "nodes", "", "200", 2),
				requests("PATCH", "nodes", "status", "200", 10),
				histogramLines("apiserver_request_duration_seconds", requestLabels("LIST", "nodes", ""), 1, 2),
				histogramLines("apiserver_request_duration_seconds", requestLabels("PATCH", "nodes", "status"), 0.5, 10),
				histogramLines("apiserver_response_sizes", requestLabels("LIST", "nodes", ""), 4000, 2),
			},
			after: []string{
				requests("LIST", "nodes", "", "200", 4),
				// Another scope: the same request kind.
				strings.Replace(requests("LIST", "nodes", "", "200", 1), `scope="cluster"`, `scope="resource"`, 1),
				requests("PATCH", "nodes", "status", "200", 2010),
				requests("PATCH", "nodes", "status", "409", 3),
				// New in the window: counted from 0.
				requests("POST", "tokenreviews", "", "201", 2000),
				requests("POST", "tokenreviews", "", "429", 5),
				requests("GET", "", "/metrics", "200", 30),
				histogramLines("apiserver_request_duration_seconds", requestLabels("LIST", "nodes", ""), 4, 5),
				histogramLines("apiserver_request_duration_seconds", requestLabels("PATCH", "nodes", "status"), 3.5, 2013),
				histogramLines("apiserver_request_duration_seconds", requestLabels("POST", "tokenreviews", ""), 2, 2005),
				histogramLines("apiserver_request_duration_seconds", requestLabels("GET", "", "/metrics"), 1.5, 30),
				histogramLines("apiserver_response_sizes", requestLabels("LIST", "nodes", ""), 34000, 5),
			},
			want: apiserverBreakdown{Requests: []requestRow{
				{Verb: "LIST", Resource: "nodes", Requests: 3, Seconds: 3, ResponseBytes: 30000},
				{Verb: "PATCH", Resource: "nodes", Subresource: "status", Requests: 2003, Errors: map[string]float64{"409": 3}, Seconds: 3},
				{Verb: "POST", Resource: "tokenreviews", Requests: 2005, Errors: map[string]float64{"429": 5}, Seconds: 2},
				{Verb: "GET", Subresource: "/metrics", Requests: 30, Seconds: 1.5},
			}},
		},
		{
			name: "watches: those started, without their duration or size",
			before: []string{
				requests("WATCH", "nodes", "", "200", 7),
				histogramLines("apiserver_request_duration_seconds", requestLabels("WATCH", "nodes", ""), 3000, 7),
				histogramLines("apiserver_response_sizes", requestLabels("WATCH", "nodes", ""), 1e8, 7),
				`apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2`,
				`apiserver_longrunning_requests{component="apiserver",group="",resource="configmaps",scope="namespace",subresource="",verb="WATCH",version="v1"} 1`,
			},
			after: []string{
				// 1,000 completed, of which the 2 open before; 2,001 open: 2,999 started.
				requests("WATCH", "nodes", "", "200", 1007),
				histogramLines("apiserver_request_duration_seconds", requestLabels("WATCH", "nodes", ""), 600000, 1007),
				histogramLines("apiserver_response_sizes", requestLabels("WATCH", "nodes", ""), 2e8, 1007),
				`apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2001`,
				// Opened in the window and still open: none completed.
				`apiserver_longrunning_requests{component="apiserver",group="",resource="configmaps",scope="namespace",subresource="",verb="WATCH",version="v1"} 4`,
			},
			want: apiserverBreakdown{Requests: []requestRow{
				{Verb: "WATCH", Resource: "nodes", Requests: 2999},
				{Verb: "WATCH", Resource: "configmaps", Requests: 3},
			}},
		},
		{
			name: "requests by FlowSchema",
			before: []string{
				`apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 100`,
				histogramLines("apiserver_flowcontrol_request_wait_duration_seconds", `execute="true",flow_schema="exempt",priority_level="exempt"`, 0, 100),
				histogramLines("apiserver_flowcontrol_request_execution_seconds", `flow_schema="exempt",priority_level="exempt",type="regular"`, 5, 100),
			},
			after: []string{
				`apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 150`,
				`apiserver_flowcontrol_dispatched_requests_total{flow_schema="kube-system-service-accounts",priority_level="workload-high"} 2000`,
				`apiserver_flowcontrol_rejected_requests_total{flow_schema="kube-system-service-accounts",priority_level="workload-high",reason="time-out"} 12`,
				`apiserver_flowcontrol_rejected_requests_total{flow_schema="dkc-node-status",priority_level="dkc-node-status",reason="queue-full"} 4`,
				histogramLines("apiserver_flowcontrol_request_wait_duration_seconds", `execute="true",flow_schema="exempt",priority_level="exempt"`, 0, 150),
				histogramLines("apiserver_flowcontrol_request_execution_seconds", `flow_schema="exempt",priority_level="exempt",type="regular"`, 6, 150),
				histogramLines("apiserver_flowcontrol_request_wait_duration_seconds", `execute="true",flow_schema="kube-system-service-accounts",priority_level="workload-high"`, 900, 1990),
				histogramLines("apiserver_flowcontrol_request_wait_duration_seconds", `execute="false",flow_schema="kube-system-service-accounts",priority_level="workload-high"`, 100, 12),
				histogramLines("apiserver_flowcontrol_request_execution_seconds", `flow_schema="kube-system-service-accounts",priority_level="workload-high",type="regular"`, 20, 1990),
				`apiserver_storage_consistency_checks_total{group="",resource="nodes",status="success"} 1`,
				`apiserver_storage_consistency_checks_total{group="rbac.authorization.k8s.io",resource="rolebindings",status="success"} 1`,
			},
			want: apiserverBreakdown{
				Flows: []flowRow{
					{FlowSchema: "kube-system-service-accounts", PriorityLevel: "workload-high", Dispatched: 2000, Rejected: 12, WaitSeconds: 1000, ExecutionSeconds: 20},
					{FlowSchema: "exempt", PriorityLevel: "exempt", Dispatched: 50, ExecutionSeconds: 1},
					{FlowSchema: "dkc-node-status", PriorityLevel: "dkc-node-status", Rejected: 4},
				},
				Checked: []string{"nodes", "rolebindings"},
			},
		},
		{
			name: "watch events, initial events, LISTs by store and etcd requests",
			before: []string{
				`apiserver_watch_events_total{group="",resource="nodes",version="v1"} 100`,
				histogramLines("apiserver_watch_events_sizes", `group="",resource="nodes",version="v1"`, 50000, 100),
				`apiserver_init_events_total{group="",resource="nodes"} 10000`,
				`etcd_requests_total{group="",operation="get",resource="leases"} 7`,
			},
			after: []string{
				`apiserver_watch_events_total{group="",resource="nodes",version="v1"} 12100`,
				histogramLines("apiserver_watch_events_sizes", `group="",resource="nodes",version="v1"`, 6050000, 12100),
				`apiserver_watch_events_total{group="",resource="configmaps",version="v1"} 2000`,
				histogramLines("apiserver_watch_events_sizes", `group="",resource="configmaps",version="v1"`, 1000000, 2000),
				`apiserver_init_events_total{group="",resource="nodes"} 20000`,
				`apiserver_init_events_total{group="",resource="configmaps"} 2000`,
				`apiserver_storage_list_total{group="",index="",resource="nodes",storage="watchcache"} 2000`,
				`apiserver_storage_list_fetched_objects_total{group="",index="",resource="nodes",storage="watchcache"} 20000000`,
				`apiserver_storage_list_returned_objects_total{group="",resource="nodes",storage="watchcache"} 2000`,
				`apiserver_storage_list_total{group="",index="",resource="configmaps",storage="etcd"} 1`,
				`apiserver_storage_list_fetched_objects_total{group="",index="",resource="configmaps",storage="etcd"} 10`,
				`apiserver_storage_list_returned_objects_total{group="",resource="configmaps",storage="etcd"} 10`,
				`etcd_requests_total{group="",operation="get",resource="leases"} 9`,
				`etcd_requests_total{group="",operation="update",resource="nodes"} 2000`,
				histogramLines("etcd_request_duration_seconds", `group="",operation="update",resource="nodes"`, 8, 2000),
			},
			want: apiserverBreakdown{
				Watches: []watchRow{
					{Resource: "nodes", Events: 12000, Bytes: 6000000, InitEvents: 10000},
					{Resource: "configmaps", Events: 2000, Bytes: 1000000, InitEvents: 2000},
				},
				Lists: []listRow{
					{Resource: "nodes", Storage: "watchcache", Lists: 2000, Fetched: 20000000, Returned: 2000},
					{Resource: "configmaps", Storage: "etcd", Lists: 1, Fetched: 10, Returned: 10},
				},
				Etcd: []etcdRow{
					{Operation: "update", Resource: "nodes", Requests: 2000, Seconds: 8},
					{Operation: "get", Resource: "leases", Requests: 2},
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := metricFamilies(strings.NewReader(exposition(tc.before...)))
			if err != nil {
				t.Fatal(err)
			}
			after, err := metricFamilies(strings.NewReader(exposition(tc.after...)))
			if err != nil {
				t.Fatal(err)
			}
			if got := breakdown(before, after); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("breakdown =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// TestBreakdownPrint checks that the table shows both windows' rows and sums what it leaves out.
func TestBreakdownPrint(t *testing.T) {
	c := breakdownComparison{Name: "test",
		DKC: apiserverBreakdown{WindowSeconds: 30, CPUSeconds: 8.5, RSSStartBytes: 500 << 20, RSSPeakBytes: 700 << 20,
			Requests: []requestRow{{Verb: "POST", Resource: "tokenreviews", Requests: 2000, Seconds: 4}}},
		Design: apiserverBreakdown{WindowSeconds: 25, CPUSeconds: 4.7}}
	for i := range breakdownRows + 2 {
		c.Design.Requests = append(c.Design.Requests, requestRow{Verb: "LIST", Resource: fmt.Sprintf("r%02d", i), Requests: 1, Seconds: 1})
	}
	var b strings.Builder
	c.print(&b)
	out := b.String()
	for _, want := range []string{"POST tokenreviews", "2000", "LIST r00", "3 more", "RSS 500 MiB at the start, peak 700 MiB", "CPU 8.50 s"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table has no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "LIST r16") {
		t.Errorf("the table shows more than %d request rows:\n%s", breakdownRows, out)
	}
}
