package router_test

import (
	"net/url"
	"testing"

	"github.com/cumulus-serving/cumulus/router"
)

func TestReachableURL(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:9/metrics", "https://router-0.example:8000/metrics", "not a url", "http://nohostport/metrics"} {
		if got := router.ReachableURL(u); got != u {
			t.Errorf("ReachableURL(%q) = %q; want it unchanged", u, got)
		}
	}
	for _, u := range []string{"http://0.0.0.0:9/metrics", "http://[::]:9/metrics", "http://:9/metrics"} {
		got, err := url.Parse(router.ReachableURL(u))
		if err != nil || got.Port() != "9" || got.Path != "/metrics" || got.Hostname() == "" || got.Hostname() == "0.0.0.0" || got.Hostname() == "::" {
			t.Errorf("ReachableURL(%q) = %v (%v); want a host other machines can reach, port 9, /metrics", u, got, err)
		}
	}
}
