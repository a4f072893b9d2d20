package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// The OpenAPI document is checked against the code: routes both ways,
// schemas against the Go types, examples through the real decoders.

type openAPI struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas   map[string]apiSchema `yaml:"schemas"`
		Responses map[string]struct {
			Content map[string]apiMedia `yaml:"content"`
		} `yaml:"responses"`
	} `yaml:"components"`
}

type apiSchema struct {
	Ref        string               `yaml:"$ref"`
	Properties map[string]apiSchema `yaml:"properties"`
	Required   []string             `yaml:"required"`
	Enum       []string             `yaml:"enum"`
	Example    any                  `yaml:"example"`
}

type apiMedia struct {
	Schema  apiSchema `yaml:"schema"`
	Example any       `yaml:"example"`
}

type apiOperation struct {
	OperationID string `yaml:"operationId"`
	RequestBody struct {
		Content map[string]apiMedia `yaml:"content"`
	} `yaml:"requestBody"`
	Responses map[string]struct {
		Ref     string              `yaml:"$ref"`
		Content map[string]apiMedia `yaml:"content"`
	} `yaml:"responses"`
	Security *[]any `yaml:"security"`
}

// schemaTypes maps every component schema to its Go type.
var schemaTypes = map[string]reflect.Type{
	"Error":              reflect.TypeFor[ErrorBody](),
	"ErrorDetail":        reflect.TypeFor[ErrorDetail](),
	"Health":             reflect.TypeFor[Health](),
	"FileUpload":         reflect.TypeFor[FileUpload](),
	"RunRequest":         reflect.TypeFor[RunRequest](),
	"RunResponse":        reflect.TypeFor[RunResponse](),
	"Result":             reflect.TypeFor[result.Result](),
	"Image":              reflect.TypeFor[result.Image](),
	"Stream":             reflect.TypeFor[result.Stream](),
	"FileChange":         reflect.TypeFor[result.FileChange](),
	"NetworkAttempt":     reflect.TypeFor[result.NetworkAttempt](),
	"NetworkSummary":     reflect.TypeFor[result.NetworkSummary](),
	"NetworkDestination": reflect.TypeFor[result.NetworkDestination](),
	"Violation":          reflect.TypeFor[result.Violation](),
	"SecretUse":          reflect.TypeFor[result.SecretUse](),
	"Finding":            reflect.TypeFor[result.Finding](),
	"CopyOut":            reflect.TypeFor[result.CopyOut](),
	"Skip":               reflect.TypeFor[result.Skip](),
	"SandboxRequest":     reflect.TypeFor[SandboxRequest](),
	"Sandbox":            reflect.TypeFor[Sandbox](),
	"SandboxList":        reflect.TypeFor[SandboxList](),
	"TimeoutRequest":     reflect.TypeFor[TimeoutRequest](),
	"ExecRequest":        reflect.TypeFor[ExecRequest](),
	"Exec":               reflect.TypeFor[Exec](),
	"ExecList":           reflect.TypeFor[ExecList](),
	"SignalRequest":      reflect.TypeFor[SignalRequest](),
	"TTYSize":            reflect.TypeFor[service.TTYSize](),
	"StdinResult":        reflect.TypeFor[StdinResult](),
	"OutputEvent":        reflect.TypeFor[OutputEvent](),
	"FileInfo":           reflect.TypeFor[engine.FileInfo](),
	"DirListing":         reflect.TypeFor[DirListing](),
	"Held":               reflect.TypeFor[Held](),
	"Approval":           reflect.TypeFor[service.Approval](),
	"Effect":             reflect.TypeFor[effects.Effect](),
	"ApprovalList":       reflect.TypeFor[ApprovalList](),
	"ApprovalDecision":   reflect.TypeFor[ApprovalDecision](),
	"ApprovalOutcome":    reflect.TypeFor[service.ApprovalOutcome](),
	"CellRequest":        reflect.TypeFor[CellRequest](),
	"Cell":               reflect.TypeFor[service.Cell](),
	"CellOutput":         reflect.TypeFor[service.CellOutput](),
	"CellError":          reflect.TypeFor[service.CellErrorInfo](),
	"Kernel":             reflect.TypeFor[service.Kernel](),
	"ContextList":        reflect.TypeFor[ContextList](),
}

// requestDecoders run a request example through what the handler runs.
var requestDecoders = map[string]func([]byte) *Error{
	"RunRequest": func(b []byte) *Error { _, e := decodeRun(b, nil, 1000); return e },
	"SandboxRequest": func(b []byte) *Error {
		_, e := decodeSandbox(b, 1000, 10*time.Minute, 24*time.Hour)
		return e
	},
	"ExecRequest": func(b []byte) *Error { _, e := decodeExec(b, manifest.Default()); return e },
	"CellRequest": func(b []byte) *Error { _, e := decodeCell(b, manifest.Default()); return e },
	"TimeoutRequest": func(b []byte) *Error {
		var r TimeoutRequest
		if e := decodeStrict(b, &r); e != nil {
			return e
		}
		_, e := parseTTL(r.TTL, 24*time.Hour)
		return e
	},
	"SignalRequest": func(b []byte) *Error {
		var r SignalRequest
		if e := decodeStrict(b, &r); e != nil {
			return e
		}
		_, e := parseSignal(r.Signal)
		return e
	},
	"TTYSize": func(b []byte) *Error {
		var r service.TTYSize
		return decodeStrict(b, &r)
	},
	"FileUpload": func(b []byte) *Error {
		var f FileUpload
		if e := decodeStrict(b, &f); e != nil {
			return e
		}
		_, e := decodeFiles([]FileUpload{f})
		return e
	},
}

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	data, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	return &doc
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options"}

func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	srv, err := New(Config{Backend: &servicetest.Backend{}, Auditor: servicetest.NewAuditor(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(t.Context()) })

	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if !slices.Contains(httpMethods, method) {
				continue
			}
			pattern := strings.ToUpper(method) + " " + path
			documented[pattern] = true
			url := strings.NewReplacer("{id}", "sb-x", "{eid}", "e-1").Replace(path)
			r := httptest.NewRequest(strings.ToUpper(method), url, nil)
			if _, got := srv.mux.Handler(r); got != pattern {
				t.Errorf("documented %s is routed to %q", pattern, got)
			}
		}
	}
	for _, route := range srv.routes {
		if !documented[route] {
			t.Errorf("route %s is not in openapi.yaml", route)
		}
	}
}

func TestOpenAPISchemas(t *testing.T) {
	doc := loadOpenAPI(t)
	for name := range doc.Components.Schemas {
		if _, ok := schemaTypes[name]; !ok {
			t.Errorf("schema %s has no Go type in schemaTypes", name)
		}
	}
	for name, typ := range schemaTypes {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s (%s) is not in openapi.yaml", name, typ)
			continue
		}
		fields, _ := strictjson.Fields(typ)
		var want, got []string
		for f := range fields {
			want = append(want, f)
		}
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("schema %s has properties %v; %s has JSON fields %v", name, got, typ, want)
		}
		for _, r := range s.Required {
			if _, ok := fields[r]; !ok {
				t.Errorf("schema %s requires %s, which %s lacks", name, r, typ)
			}
		}
		if s.Example != nil {
			checkExample(t, "schema "+name, name, s.Example)
		}
	}
	// The error codes are the package's.
	codes := doc.Components.Schemas["ErrorDetail"].Properties["code"].Enum
	want := []string{CodeBadRequest, CodeInvalidField, CodeUnauthenticated, CodeForbidden, CodeNotFound, CodeMethodNotAllowed, CodeConflict, CodeTooLarge, CodeQuotaExceeded, CodeInternal, CodeUnavailable}
	if !slices.Equal(codes, want) {
		t.Errorf("error codes %v, want %v", codes, want)
	}
	for name, resp := range doc.Components.Responses {
		m := resp.Content["application/json"]
		if m.Schema.Ref != "#/components/schemas/Error" || m.Example == nil {
			t.Errorf("response %s is not an Error with an example", name)
			continue
		}
		checkExample(t, "response "+name, "Error", m.Example)
		var eb ErrorBody
		b, _ := json.Marshal(m.Example)
		json.Unmarshal(b, &eb)
		if !slices.Contains(want, eb.Error.Code) {
			t.Errorf("response %s example has code %q", name, eb.Error.Code)
		}
	}
}

func TestOpenAPIOperations(t *testing.T) {
	doc := loadOpenAPI(t)
	// What the document says needs no key must be what the server
	// serves without one, and nothing else.
	srv, err := New(Config{Backend: &servicetest.Backend{}, Auditor: servicetest.NewAuditor(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	publicRoutes := map[string]bool{}
	for pattern, o := range srv.routeOpts {
		publicRoutes[pattern] = o.public
	}
	ids := map[string]bool{}
	for path, item := range doc.Paths {
		for method, raw := range item {
			if !slices.Contains(httpMethods, method) {
				continue
			}
			where := strings.ToUpper(method) + " " + path
			b, _ := yaml.Marshal(raw)
			var op apiOperation
			if err := yaml.Unmarshal(b, &op); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if op.OperationID == "" || ids[op.OperationID] {
				t.Errorf("%s: operationId %q missing or repeated", where, op.OperationID)
			}
			ids[op.OperationID] = true
			public := op.Security != nil && len(*op.Security) == 0
			if _, ok := op.Responses["401"]; !ok && !public {
				t.Errorf("%s: needs a key but does not document 401", where)
			}
			if public != publicRoutes[where] {
				t.Errorf("%s: documented as unauthenticated: %v; served without a key: %v", where, public, publicRoutes[where])
			}
			for mt, m := range op.RequestBody.Content {
				if mt != "application/json" {
					continue
				}
				name := strings.TrimPrefix(m.Schema.Ref, "#/components/schemas/")
				if m.Example == nil {
					t.Errorf("%s: JSON request without an example", where)
					continue
				}
				checkExample(t, where+" request", name, m.Example)
			}
			for code, resp := range op.Responses {
				for mt, m := range resp.Content {
					if mt != "application/json" || m.Example == nil {
						continue
					}
					checkExample(t, where+" "+code, strings.TrimPrefix(m.Schema.Ref, "#/components/schemas/"), m.Example)
				}
			}
		}
	}
}

// checkExample decodes a YAML example as JSON into the schema's Go type:
// through the handler's own decoder for requests, strictly for responses.
func checkExample(t *testing.T, where, schema string, example any) {
	t.Helper()
	typ, ok := schemaTypes[schema]
	if !ok {
		t.Errorf("%s: no Go type for schema %q", where, schema)
		return
	}
	b, err := json.Marshal(example)
	if err != nil {
		t.Errorf("%s: example does not convert to JSON: %v", where, err)
		return
	}
	if dec, ok := requestDecoders[schema]; ok {
		if e := dec(b); e != nil {
			t.Errorf("%s: example %s refused: %s", where, b, e.Message)
		}
		return
	}
	v := reflect.New(typ).Interface()
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Errorf("%s: example %s does not decode into %s: %v", where, b, typ, err)
	}
}
