// Package tlstest is for tests only: it makes a certificate authority and certificates it
// signs, in the test's own temporary directory, so TLS tests need no files from outside and
// no openssl (issue 15, point 2).
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority. File is its certificate (PEM), for --ca flags.
type CA struct {
	File string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid for a day and writes its certificate to <t.TempDir()>/ca.pem.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "berth test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{File: filepath.Join(t.TempDir(), "ca.pem"), cert: cert, key: key}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a server certificate named name for hosts (IP addresses or DNS names), valid
// for a day, and writes it and its key to certFile and keyFile (PEM, mode 0600), replacing
// what is there. It returns the certificate's serial number.
func (ca *CA) Issue(t testing.TB, certFile, keyFile, name string, hosts ...string) *big.Int {
	t.Helper()
	return ca.IssueValid(t, certFile, keyFile, name, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), hosts...)
}

// IssueValid is Issue for a certificate valid from notBefore to notAfter (an expired one,
// say).
func (ca *CA) IssueValid(t testing.TB, certFile, keyFile, name string, notBefore, notAfter time.Time, hosts ...string) *big.Int {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	writePEM(t, certFile, "CERTIFICATE", der)
	return tmpl.SerialNumber
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
