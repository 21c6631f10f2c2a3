package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServeUntilContextEnds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Listener{Name: "test", Addr: addr, Grace: time.Second,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })})
	}()
	var body string
	for i := 0; i < 100; i++ {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if body != "ok" {
		t.Fatalf("served %q, want ok", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after ctx ended = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after ctx ended")
	}
}

func TestServeReportsAListenFailure(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	err = Serve(context.Background(), Listener{Name: "metrics", Addr: lis.Addr().String(), Handler: http.NotFoundHandler(), Grace: time.Second})
	if err == nil || !strings.Contains(err.Error(), "serve metrics on "+lis.Addr().String()) {
		t.Fatalf("Serve on a taken address = %v, want an error naming the listener and address", err)
	}
}
