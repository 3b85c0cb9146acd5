package palisade

// A client certificate is a principal (issue 31), from Go: a palisade dev
// --tls cluster whose policy names the certificate palisade certs init
// issued (client.palisade) as principal svc, allowed the gocert- leases
// only. The client presents it (no API key) and gets exactly svc's rights,
// on the election nodes and the gateway; without it, nothing.

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func policyWithCertificate(t testing.TB, data string) {
	bin := palisadeBin(t)
	for _, args := range [][]string{
		{"policy", "init", "--dir", data},
		{"policy", "add", "--dir", data, "svc", "--acquire", "gocert-", "--read", "gocert-",
			"--certificate", "client.palisade"},
	} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("palisade %v: %v\n%s", args, err, out)
		}
	}
}

func TestClientCertificateIsItsPrincipal(t *testing.T) {
	d := startDevWith(t, devOptions{tls: true, prepare: policyWithCertificate})
	t.Cleanup(d.stop)
	certs := filepath.Join(d.data, "certs")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := Config{Election: d.election, Gateway: d.gateway, CAFile: filepath.Join(certs, "ca.pem"),
		RetryBudget: testRetryBudget}

	withCert := base
	withCert.ClientCertFile = filepath.Join(certs, "client.pem")
	withCert.ClientKeyFile = filepath.Join(certs, "client-key.pem")
	c, err := NewClient(withCert)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lease, err := c.Acquire(ctx, "gocert-1", "go-holder", 5*time.Second)
	if err != nil {
		t.Fatalf("acquire with the certificate: %v", err)
	}
	if _, err := lease.Put(ctx, "gocert-1/k", []byte("v")); err != nil {
		t.Fatalf("fenced put with the certificate: %v", err)
	}
	info, err := c.Get(ctx, "gocert-1")
	if err != nil || info.Holder != "go-holder" {
		t.Fatalf("get: %+v, %v", info, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "other-1", "go-holder", 5*time.Second); !errors.Is(err, ErrForbidden) {
		t.Fatalf("another principal's lease: %v, want ErrForbidden", err)
	}

	without, err := NewClient(base)
	if err != nil {
		t.Fatal(err)
	}
	defer without.Close()
	if _, err := without.Acquire(ctx, "gocert-2", "go-holder", 5*time.Second); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("without the certificate: %v, want ErrUnauthorized", err)
	}

	half := base
	half.ClientCertFile = withCert.ClientCertFile
	if _, err := NewClient(half); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a certificate without its key: %v, want ErrBadRequest", err)
	}
}
