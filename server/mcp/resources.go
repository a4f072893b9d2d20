package mcp

import (
	"context"
	"errors"
	"mime"
	"net/url"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/service"
)

// A sandbox's files as MCP resources: download returns one embedded, and
// resources/read reads it again by its URI while the sandbox lives, as the
// key that owns the sandbox (another key's is not found).

// fileTemplate is the URI template of a sandbox's file.
const fileTemplate = "moat://sandboxes/{sandbox_id}/files/{+path}"

// fileURI names a sandbox's file as a resource.
func fileURI(sandboxID, p string) string {
	return "moat://sandboxes/" + url.PathEscape(sandboxID) + "/files/" + (&url.URL{Path: p}).EscapedPath()
}

// parseFileURI is fileURI's inverse; the path is checked by the caller.
func parseFileURI(uri string) (sandboxID, p string, ok bool) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "moat" || u.Host != "sandboxes" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", false
	}
	id, rest, found := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/files/")
	if !found || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, rest, true
}

// fileContents is a file's content as a resource: text for text types,
// a blob (base64 on the wire) with the type from its extension otherwise.
func fileContents(uri, p string, data []byte) *mcp.ResourceContents {
	typ := mime.TypeByExtension(path.Ext(p))
	rc := &mcp.ResourceContents{URI: uri}
	if _, enc := textOrBase64(data); enc == "utf-8" && (typ == "" || strings.HasPrefix(typ, "text/") || strings.Contains(typ, "json")) {
		if typ == "" {
			typ = "text/plain; charset=utf-8"
		}
		rc.Text = string(data)
	} else {
		if typ == "" {
			typ = "application/octet-stream"
		}
		rc.Blob = data
	}
	rc.MIMEType = typ
	return rc
}

// addFiles registers the resource template of sandboxes' files.
func (s *Server) addFiles(srv *mcp.Server, c *conn) {
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "A file of a sandbox",
		URITemplate: fileTemplate,
		Description: "A file of a sandbox's /workspace (what download returns), readable while the sandbox lives.",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		key, ok := c.key(req.Extra)
		if !ok {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "unauthenticated: a valid API key is required"}
		}
		id, p, ok := parseFileURI(uri)
		if !ok {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		data, _, err := s.readAll(ctx, key, id, p)
		if err != nil {
			// A resource read has no tool error: the protocol's error
			// carries the same message.
			var e *service.Error
			if !errors.As(err, &e) {
				e = service.InternalError(err)
			}
			if e.Kind == service.NotFound {
				return nil, mcp.ResourceNotFoundError(uri)
			}
			if e.Kind == service.Internal {
				s.log.Error("mcp: read resource", "uri", uri, "err", err)
			}
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: e.Kind.String() + ": " + e.Message}
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{fileContents(uri, p, data)}}, nil
	})
}
