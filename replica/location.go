package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Location is where a replica lives: s3://BUCKET/PREFIX on an S3-compatible
// endpoint.
type Location struct {
	Bucket string
	Prefix string // "" or a path without leading or trailing slash
	// Endpoint is the server's URL (http:// means no TLS); "" means AWS S3
	// (s3.amazonaws.com, or the regional endpoint for Region).
	Endpoint string
	Region   string
}

// String is the replica's URL, s3://BUCKET/PREFIX.
func (l Location) String() string {
	if l.Prefix == "" {
		return "s3://" + l.Bucket
	}
	return "s3://" + l.Bucket + "/" + l.Prefix
}

// ParseURL parses s3://BUCKET/PREFIX (the prefix may be empty or hold
// slashes). endpoint and region are --replica-endpoint and --replica-region.
func ParseURL(raw, endpoint, region string) (Location, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Location{}, fmt.Errorf("%w: %q is not s3://BUCKET/PREFIX", ErrBadURL, truncate(raw, 80))
	}
	loc := Location{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), Region: region}
	if strings.Contains(loc.Prefix, "//") {
		return Location{}, fmt.Errorf("%w: %q has an empty path element", ErrBadURL, truncate(raw, 80))
	}
	if endpoint != "" {
		e, err := url.Parse(endpoint)
		if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || (e.Path != "" && e.Path != "/") {
			return Location{}, fmt.Errorf("%w: --replica-endpoint %q is not http(s)://HOST[:PORT]", ErrBadURL, truncate(endpoint, 80))
		}
		loc.Endpoint = e.Scheme + "://" + e.Host
	}
	return loc, nil
}

// key is the object key of rel under the replica's prefix.
func (l Location) key(rel string) string {
	if l.Prefix == "" {
		return rel
	}
	return l.Prefix + "/" + rel
}

// rel strips the replica's prefix from an object key.
func (l Location) rel(key string) string {
	if l.Prefix == "" {
		return key
	}
	return strings.TrimPrefix(key, l.Prefix+"/")
}

// requestTimeout bounds one request that is not a large transfer.
const requestTimeout = 30 * time.Second

// Client is an open connection to a replica: minio-go's client and the
// location. It is safe for concurrent use.
type Client struct {
	loc Location
	mc  *minio.Client
	// anonymous: no credentials were found (requests are unsigned); an
	// access error then says where credentials come from.
	anonymous bool
}

// Open makes a client for loc. Credentials come from, in order, the
// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN),
// the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
// ~/.aws/credentials, profile AWS_PROFILE or "default"), and — only when the
// environment names them — a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE,
// as on EKS) or a container credentials endpoint
// (AWS_CONTAINER_CREDENTIALS_*). The EC2 instance metadata endpoint is never
// asked: off EC2 it does not answer, and the wait would stall every start.
// Open does no network I/O.
func Open(loc Location) (*Client, error) {
	providers := []credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}}
	if os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" || os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != "" ||
		os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI") != "" {
		providers = append(providers, &credentials.IAM{Client: &http.Client{Timeout: 10 * time.Second}})
	}
	creds := credentials.NewChainCredentials(providers)
	v, _ := creds.GetWithContext(&credentials.CredContext{Client: &http.Client{Timeout: 10 * time.Second}})
	host, secure := "s3.amazonaws.com", true
	if loc.Region != "" && loc.Endpoint == "" {
		host = "s3." + loc.Region + ".amazonaws.com"
	}
	if loc.Endpoint != "" {
		e, _ := url.Parse(loc.Endpoint)
		host, secure = e.Host, e.Scheme == "https"
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, fmt.Errorf("replica: HTTP transport: %w", err)
	}
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = requestTimeout
	mc, err := minio.New(host, &minio.Options{
		Creds: creds, Secure: secure, Region: loc.Region, Transport: tr,
		BucketLookup: minio.BucketLookupAuto,
		MaxRetries:   1, // our own loop retries with back-off
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadURL, err)
	}
	return &Client{loc: loc, mc: mc, anonymous: v.SignerType == credentials.SignatureAnonymous}, nil
}

// Location is where this client points.
func (c *Client) Location() Location { return c.loc }

// Check verifies that the bucket exists and can be listed with the
// credentials: a clear error for a wrong key, a missing bucket or an
// unreachable endpoint before anything else is tried.
func (c *Client) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	for obj := range c.mc.ListObjects(ctx, c.loc.Bucket, minio.ListObjectsOptions{Prefix: c.loc.key(""), MaxKeys: 1}) {
		if obj.Err != nil {
			return c.wrap("list", c.loc.String(), obj.Err)
		}
		break
	}
	return nil
}

// wrap turns a client error into one of this package's, naming the
// operation and the object, and saying what to do.
func (c *Client) wrap(op, what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchBucket":
		return fmt.Errorf("%w: %s %s: bucket %q does not exist at %s; create it or fix --replica",
			ErrBucket, op, truncate(what, 200), truncate(c.loc.Bucket, 64), c.endpointName())
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled":
		hint := "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or the shared credentials file) and the bucket's policy"
		if c.anonymous {
			hint = "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or AWS_SHARED_CREDENTIALS_FILE/AWS_PROFILE"
		}
		return fmt.Errorf("%w: %s %s: %s (%s); %s", ErrAuth, op, truncate(what, 200), resp.Code, truncate(resp.Message, 160), hint)
	case "NoSuchKey":
		return fmt.Errorf("%w: %s %s: %s", ErrNotFound, op, truncate(what, 200), resp.Code)
	case "XMinioStorageFull", "StorageFull", "XMinioAdminBucketQuotaExceeded", "XMinioBucketQuotaExceeded", "QuotaExceeded", "InsufficientStorage":
		return fmt.Errorf("%w: %s %s: %s (%s); free space in the store or raise the bucket's quota (uploads are retried)",
			ErrFull, op, truncate(what, 200), resp.Code, truncate(resp.Message, 160))
	case "AuthorizationHeaderMalformed", "InvalidRegion", "PermanentRedirect":
		return fmt.Errorf("%w: %s %s: %s (%s); check --replica-region and --replica-endpoint", ErrBucket, op, truncate(what, 200), resp.Code, truncate(resp.Message, 160))
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, context.DeadlineExceeded) || isConnErr(err) {
		return fmt.Errorf("%w: %s %s at %s: %v", ErrNetwork, op, truncate(what, 200), c.endpointName(), truncateErr(err))
	}
	if resp.StatusCode == http.StatusInsufficientStorage {
		return fmt.Errorf("%w: %s %s: server error %d %s; free space in the store or raise the bucket's quota (uploads are retried)",
			ErrFull, op, truncate(what, 200), resp.StatusCode, truncate(resp.Code, 64))
	}
	if resp.StatusCode >= 500 {
		return fmt.Errorf("%w: %s %s: server error %d %s", ErrNetwork, op, truncate(what, 200), resp.StatusCode, truncate(resp.Code, 64))
	}
	return fmt.Errorf("replica: %s %s: %v", op, truncate(what, 200), truncateErr(err))
}

func (c *Client) endpointName() string {
	if c.loc.Endpoint != "" {
		return c.loc.Endpoint
	}
	return "AWS S3"
}

func isConnErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "connection reset") ||
		strings.Contains(s, "EOF") || strings.Contains(s, "broken pipe") || strings.Contains(s, "no such host")
}

// truncate caps text that came from the bucket or the command line before
// it reaches a message.
func truncate(s string, n int) string { return clip.String(s, n) }

func truncateErr(err error) string { return truncate(err.Error(), 300) }
