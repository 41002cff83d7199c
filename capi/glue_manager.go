package capi

/*
#include "kvcm/kvcm.h"
#include "shim_generated.h"
#include "kvcm_internal.h"
*/
import "C"

import (
	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/layout"
)

// ---- Create and destroy ----

func glueManagerCreate(mc abimodel.ManagerConfig, codecArg *coldPageCodecArg, out *C.kvcm_manager) error {
	if codecArg.err != nil {
		return codecArg.err
	}
	cfg, opts, err := mc.Resolve()
	if err != nil {
		return err
	}
	opts.Codec = codecArg.owned // consumed by New, also on failure
	opts.Builtin = codecArg.builtin
	m, err := abimodel.New(cfg, opts)
	if err != nil {
		return err
	}
	obj := &managerObj{Manager: m}
	obj.handle = newHandle(obj)
	*out = C.kvcm_manager(obj.handle)
	return nil
}

func glueManagerDestroy(mgr *managerObj) error {
	if !deleteHandle(mgr.handle) {
		return errorf(codeInvalidHandle, "manager: %#x was destroyed concurrently", mgr.handle)
	}
	return mgr.Close()
}

func glueManagerProbeReusePages(mgr *managerObj, scope blockhash.Scope, tokens []config.Token, lg C.kvcm_layer_group_id, partial C.bool) ([]core.ReusePage, error) {
	_, pages, err := mgr.Core().ReusePages(scope, tokens, layout.LayerGroupID(lg), bool(partial))
	return pages, err
}
