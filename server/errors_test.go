package server

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/moat-sandbox/moat/service"
)

// TestHTTPError: every service error Kind has its status and code, the
// message and field are the service's, and the mapping reverses.
func TestHTTPError(t *testing.T) {
	tests := []struct {
		kind   service.Kind
		status int
		code   string
	}{
		{service.Internal, 500, CodeInternal},
		{service.BadRequest, 400, CodeBadRequest},
		{service.Invalid, 400, CodeInvalidField},
		{service.Unauthenticated, 401, CodeUnauthenticated},
		{service.Forbidden, 403, CodeForbidden},
		{service.NotFound, 404, CodeNotFound},
		{service.Conflict, 409, CodeConflict},
		{service.TooLarge, 413, CodeTooLarge},
		{service.Quota, 429, CodeQuotaExceeded},
		{service.Unavailable, 503, CodeUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			se := &service.Error{Kind: tc.kind, Field: "f", Message: "m", RetryAfter: 3}
			e := httpError(fmt.Errorf("wrapped: %w", se))
			if e.Status != tc.status || e.Code != tc.code || e.Message != "m" || e.Field != "f" || e.RetryAfter != 3 {
				t.Errorf("httpError(%s) = %+v", tc.kind, e)
			}
			if tc.code == tc.kind.String() && KindOfStatus(tc.status) != tc.kind && tc.status != http.StatusBadRequest {
				t.Errorf("KindOfStatus(%d) = %s, want %s", tc.status, KindOfStatus(tc.status), tc.kind)
			}
		})
	}
	if k := KindOfStatus(http.StatusBadRequest); k != service.Invalid {
		t.Errorf("KindOfStatus(400) = %s", k)
	}
	if e := httpError(errors.New("boom")); e.Status != 500 || e.Message == "boom" {
		t.Errorf("a plain error: %+v", e)
	}
}
