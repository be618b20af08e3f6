// Command podbin is the one binary of the test cluster's own images (tools/envtest/images.py):
// the pod sandbox's pause process, and a tiny workload for tests on the real node.
//
//	podbin pause          block until SIGTERM/SIGINT, reaping children (the sandbox "pause")
//	podbin serve PORT     HTTP server: /healthz answers "ok", / answers "podbin <hostname>"
//	podbin lookup NAME    resolve NAME with the pod's /etc/resolv.conf, print the addresses
//	podbin get URL        HTTP GET URL, print the status and body (bounded to 64 KiB)
//	podbin dial HOST:PORT open a TCP connection (a Service's DNAT path), print "connected"
//
// Static (CGO_ENABLED=0), so the image is this one file.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func pause() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}

func serve(port string) {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "podbin %s\n", host) })
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		<-sigs
		os.Exit(0)
	}()
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "pause" {
		pause()
		return
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "lookup":
		addrs, err := net.LookupHost(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, a := range addrs {
			fmt.Println(a)
		}
	case "get":
		c := &http.Client{Timeout: 10 * time.Second}
		r, err := c.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer r.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		fmt.Printf("%d %s", r.StatusCode, body)
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[2], 10*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("connected", os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "usage: podbin pause|serve PORT|lookup NAME|get URL|dial HOST:PORT")
		os.Exit(2)
	}
}
