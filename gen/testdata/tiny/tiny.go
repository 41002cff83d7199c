// Package tiny is a small ABI description for kvcmgen's golden-file tests:
// one of each kind of declaration.
//
// # Changes
//
// What changed for users, copied into the API reference:
//
//   - tiny_thing_destroy reports a stream in use.
//
// # Other
//
// Text under other headings stays out of the reference.
package tiny

import "github.com/kvcm/kvcm/gen/spec"

// ABIVersion is the ABI version.
//
//kvcm:since 1
const ABIVersion uint32 = 2

// Name is a string constant.
//
//kvcm:since 1
const Name = "tiny"

// Code is a status code.
//
//kvcm:enum trim=Err cprefix=KVCM_ERR_ cpp=Code
//kvcm:gocodes code
//kvcm:since 1
type Code int32

const (
	// OK is success.
	//
	//kvcm:cname KVCM_OK
	OK Code = 0
	// ErrBadArgument: an argument is bad.
	ErrBadArgument Code = 1
)

// Where is a location with a negative value.
//
//kvcm:enum trim=Where cprefix=KVCM_WHERE_ cpp=Where cppbase=int
//kvcm:pyenum Place HERE=AT_HOME
//kvcm:since 1
type Where int32

const (
	// WhereNowhere is failure.
	WhereNowhere Where = -1
	// WhereHere is here.
	WhereHere Where = 0
)

// Widget is a handle.
//
//kvcm:handle
//kvcm:gohandle widgetObj widget
//kvcm:gomodel strings.Builder
//kvcm:since 1
type Widget uint64

// Ptr is an address.
//
//kvcm:typedef
//kvcm:cppalias Address
//kvcm:since 1
type Ptr uint64

// Status is an error.
//
//kvcm:opaque
//kvcm:status
//kvcm:since 1
type Status struct{}

// API is the function table.
//
//kvcm:opaque
//kvcm:apitable
//kvcm:since 1
type API struct{}

// Notify is a callback.
//
//kvcm:callback
//kvcm:since 1
type Notify func(userData spec.VoidPtr, value int64) int32

// Pair is an aligned pair.
//
//kvcm:struct
//kvcm:align 8
//kvcm:since 1
//kvcm:go inout image.Point
//kvcm:pyvalue
type Pair struct {
	// A is first.
	A int32 `go:"X"`
	// B is second.
	B int32 `go:"Y"`
}

// Options are versioned options.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
//kvcm:cppns c
type Options struct {
	// Flag is a flag.
	Flag bool
	// Pairs are pairs.
	Pairs spec.In[Pair] `len:"NumPairs" nullable:"true" own:"borrowed"`
	// NumPairs is the length of pairs.
	NumPairs spec.Size
	// Label is a label.
	Label spec.CStr `nullable:"true" own:"borrowed"`
	// Extra appeared later.
	Extra int64 `since:"2"`
}

// Shape is a configuration value of the bindings.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Shape order=sides,name,scale
//kvcm:cppfield scale double 1.0 | Scale is the bindings' own field.
//kvcm:pyconfig Shape
//kvcm:pyfield scale float 1.0 | Scale is the bindings' own field.
type Shape struct {
	// Name is the shape's name.
	Name spec.CStr `own:"borrowed" path:"label"`
	// Sides is its number of sides.
	Sides int32 `cppdefault:"3" pydefault:"3"`
	// Hidden is converted by hand.
	Hidden bool `cpp:"-" py:"-"`
}

// Drawing holds shapes.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Drawing
//kvcm:pyconfig Drawing
type Drawing struct {
	// Shapes are its shapes.
	Shapes spec.In[Shape] `len:"NumShapes" own:"borrowed" py:"items" pydefault:"[]"`
	// NumShapes is the length of shapes.
	NumShapes spec.Size
	// Main is the main shape (NULL for none).
	Main spec.In[Shape] `nullable:"true" own:"borrowed" pydefault:"None"`
	// Weights are weights (NULL for none).
	Weights spec.In[float64] `len:"NumWeights" nullable:"true" own:"borrowed" pydefault:"None"`
	// NumWeights is the length of weights.
	NumWeights spec.Size
}

// Spot is split by kind in Python and C++.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Spot
//kvcm:cppvariant HomeSpot where=kHere args=x:xAt,dir:directory=""
//kvcm:pyvariant HomeSpot where=HERE fields=x,dir,grain
//kvcm:pyvariantfield HomeSpot grain int -1 into=grain | The site's grain.
//kvcm:pyvariant NowhereSpot where=NOWHERE fields=x=None,keep,scale=1.0,name=''
//kvcm:pyvariantfield NowhereSpot keep bool False into=keep | Keeps the site.
type Spot struct {
	// Where is the spot's kind.
	Where Where `py:"place"`
	// X is a coordinate.
	X int64
	// Dir is a directory.
	Dir spec.CStr `nullable:"true" own:"borrowed" pytype:"path"`
	// Scale is a factor.
	Scale float64 `cppdefault:"1.0"`
	// Name is a name.
	Name spec.CStr `nullable:"true" own:"borrowed"`
}

// Site holds spots.
//
//kvcm:struct
//kvcm:since 1
type Site struct {
	// Spots are its spots.
	Spots spec.In[Spot] `len:"NumSpots" own:"borrowed"`
	// NumSpots is the length of spots.
	NumSpots spec.Size
	// Grain is a home spot's grain.
	Grain int32
	// Keep is a nowhere spot's flag.
	Keep bool
}

// Note is a result the library writes.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Note out
type Note struct {
	// Text is the note's text.
	Text spec.CStr `nullable:"true" own:"borrowed"`
	// Codes are its codes.
	Codes spec.In[int32] `len:"NumCodes" nullable:"true" own:"borrowed"`
	// NumCodes is the length of codes.
	NumCodes spec.Size
	// Kind is the note's kind.
	Kind Where
}

// Sample is a result with an array.
//
//kvcm:struct
//kvcm:since 1
//kvcm:pyvalue order=codes,id
type Sample struct {
	// ID is its id.
	ID uint64 `pydefault:"0"`
	// Codes are its codes.
	Codes spec.In[int32] `len:"NumCodes" nullable:"true" own:"borrowed"`
	// NumCodes is the length of codes.
	NumCodes spec.Size
}

// Tally counts the hits of one key.
//
//kvcm:struct
//kvcm:since 1
//kvcm:pyvalue TallyDelta prefix=n_ counters
type Tally struct {
	// Key is the key counted; the Python record leaves it out.
	Key int32 `py:"-"`
	// Hits are hits.
	Hits int64
	// Misses are misses.
	Misses int64
	// At is where they were counted.
	At Where `pydefault:"Place.AT_HOME"`
}

// Tag names a thing for a function: a number, a label and salt bytes.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Tag arg
type Tag struct {
	// Number is its number.
	Number int32
	// Label is its label.
	Label spec.CStr `own:"borrowed"`
	// Salt is salt_len bytes; it may hold NUL bytes.
	Salt spec.CStr `len:"SaltLen" nullable:"true" own:"borrowed"`
	// SaltLen is the length of salt.
	SaltLen spec.Size
}

// Report is a result with pairs and bytes.
//
//kvcm:struct
//kvcm:since 1
//kvcm:cppns c
//kvcm:cppvalue Report out
type Report struct {
	// Pairs are its pairs.
	Pairs spec.In[Pair] `len:"NumPairs" nullable:"true" own:"borrowed"`
	// NumPairs is the length of pairs.
	NumPairs spec.Size
	// Salt is salt_len bytes.
	Salt spec.CStr `len:"SaltLen" nullable:"true" own:"borrowed"`
	// SaltLen is the length of salt.
	SaltLen spec.Size
}

// Plugin is a vtable.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:goimpl builtin github.com/kvcm/kvcm/gen/testdata/tinygo.Plugin
//kvcm:cppimpl
//kvcm:since 1
type Plugin struct {
	// Run runs.
	Run func(self spec.VoidPtr, pairs spec.In[Pair], n spec.Size) bool `cpp:"-"`
	// Probe is optional.
	Probe func(self spec.VoidPtr) int32 `nullable:"true"`
	// Destroy destroys.
	Destroy func(self spec.VoidPtr) `cpp:"-"`
}

// Strip is a result with an array, which the library writes into a nested
// buffer of the caller's.
//
//kvcm:struct
//kvcm:since 2
//kvcm:go out image.Gray
type Strip struct {
	// Stride is its stride.
	Stride int64
	// Pix are its pixels.
	Pix spec.In[uint8] `len:"NumPix" own:"borrowed"`
	// NumPix is the length of pix.
	NumPix spec.Size
}

// Label is a name with its length.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go in github.com/kvcm/kvcm/gen/testdata/tinygo.Label
type Label struct {
	// Data holds the bytes.
	Data spec.CStr `len:"Len" nullable:"true" own:"borrowed" go:"Text"`
	// Len is its length.
	Len spec.Size
}

// Ranker is a vtable the library calls from Go.
//
//kvcm:vtable
//kvcm:versioned
//kvcm:since 1
//kvcm:gocaller github.com/kvcm/kvcm/gen/testdata/tinygo.Ranker
type Ranker struct {
	// Rank writes to order the indices of names, best first.
	Rank func(self spec.VoidPtr, names spec.In[Label], numNames spec.Size, order spec.Out[spec.Size]) int32 `nullable:"true" sized:"order=numNames"`
	// Destroy destroys.
	Destroy func(self spec.VoidPtr)
}

// PluginObject is a plugin and its self.
//
//kvcm:struct
//kvcm:since 1
type PluginObject struct {
	// Vtable is the table.
	Vtable spec.In[Plugin] `own:"borrowed"`
	// Self is the state.
	Self spec.VoidPtr `own:"owned"`
}

// GetAPI returns the table.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl api
//kvcm:param version in The version.
//kvcm:returns The table or NULL.
type GetAPI func(version uint32) spec.In[API]

// WidgetCreate creates a widget, consuming the plugin.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:param options borrowed The options.
//kvcm:param plugin consumed,nullable The plugin.
//kvcm:param out out Receives the widget.
type WidgetCreate func(options spec.In[Options], plugin spec.In[PluginObject], out spec.Out[Widget]) *Status

// WidgetNotify calls fn with user data.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:param widget in The widget.
//kvcm:param fn in The callback.
//kvcm:param userData borrowed,nullable Passed to fn.
//kvcm:param pairs out,nullable,len=capacity,buffer=needed Receives pairs.
//kvcm:param capacity in Capacity of pairs.
//kvcm:param needed out Receives the count.
type WidgetNotify func(widget Widget, fn Notify, userData spec.VoidPtr, pairs spec.Out[Pair], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// WidgetTag tags a widget with a name and values.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param name borrowed,nullable,len=nameLen,string The name's bytes.
//kvcm:param nameLen in The name's length.
//kvcm:param values borrowed,nullable,len=numValues,slice,short,go=int The values.
//kvcm:param numValues in The number of values.
type WidgetTag func(widget Widget, name spec.CStr, nameLen spec.Size, values spec.In[int32], numValues spec.Size) *Status

// WidgetTakePairs returns the pairs a label collected and resets them.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param label borrowed,string The label.
//kvcm:param origin borrowed,convert The origin the pairs are relative to.
//kvcm:param pairs out,nullable,len=capacity,buffer=needed,reset Receives pairs.
//kvcm:param capacity in Capacity of pairs.
//kvcm:param needed out Receives the count.
type WidgetTakePairs func(widget Widget, label spec.CStr, origin spec.In[Pair], pairs spec.Out[Pair], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// WidgetMovePairs moves the widget along pairs.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param pairs borrowed,nullable,len=numPairs,convert The pairs (NULL only when num_pairs is 0).
//kvcm:param numPairs in The number of pairs.
type WidgetMovePairs func(widget Widget, pairs spec.In[Pair], numPairs spec.Size) *Status

// Count returns a count.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:returns The count.
type Count func() uint64

// StatusFree frees a status.
//
//kvcm:since 1
//kvcm:thread any
//kvcm:impl c
//kvcm:param status consumed,nullable The status.
type StatusFree func(status spec.Out[Status])

// WidgetStrips writes the widget's strips, their pixels one strip after
// another, two results and an index per value.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param origin borrowed,convert The origin.
//kvcm:param shift in,into=origin.X The origin's X instead.
//kvcm:param values borrowed,nullable,len=numValues,slice,go=int The values.
//kvcm:param numValues in The number of values.
//kvcm:param order out,nullable,len=numValues,sized,go=int Receives an index per value.
//kvcm:param first out,result Receives the first strip's stride.
//kvcm:param count out,result Receives the number of pixels.
//kvcm:param strips out,nullable,len=stripsCap,buffer=numStrips Receives the strips.
//kvcm:param stripsCap in Capacity of strips.
//kvcm:param pix out,nullable,len=pixCap,of=strips.pix,buffer=numPix Receives every strip's pixels.
//kvcm:param pixCap in Capacity of pix.
//kvcm:param numStrips out Receives the number of strips.
//kvcm:param numPix out Receives the number of pixels.
type WidgetStrips func(widget Widget, origin spec.In[Pair], shift int32, values spec.In[int32], numValues spec.Size, order spec.Out[spec.Size], first spec.Out[int64], count spec.Out[uint32], strips spec.Out[Strip], stripsCap spec.Size, pix spec.Out[uint8], pixCap spec.Size, numStrips spec.Out[spec.Size], numPix spec.Out[spec.Size]) *Status

// WidgetLen returns the length of the widget's text: the export calls the
// method of the widget's object.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:call Len
//kvcm:param widget in The widget.
//kvcm:param out out,result Receives the length.
type WidgetLen func(widget Widget, out spec.Out[int64]) *Status

// Ones counts the set bits of a value: the export calls a package-level
// function.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:call math/bits.OnesCount64
//kvcm:param v in The value.
//kvcm:param out out,result Receives the count.
type Ones func(v uint64, out spec.Out[int32]) *Status

// WidgetProfile writes the widget's profile records as columns: each
// record's allocated bytes in one array, its 32 stack frames side by side
// in another.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param bytes out,nullable,len=capacity,buffer=needed,go=runtime.MemProfileRecord,column=AllocBytes Receives each record's bytes.
//kvcm:param stacks out,nullable,len=capacity,column=bytes.Stack0 Receives 32 frames per record.
//kvcm:param capacity in Capacity, in records.
//kvcm:param needed out Receives the number of records.
type WidgetProfile func(widget Widget, bytes spec.Out[int64], stacks spec.Out[uint64], capacity spec.Size, needed spec.Out[spec.Size]) *Status

// WidgetTakeStrips takes the strips that fit the caller's buffers, their
// pixels one strip after another.
//
//kvcm:since 2
//kvcm:thread any
//kvcm:param widget in The widget.
//kvcm:param strips out,nullable,len=stripsCap,buffer=numStrips,take Receives the strips.
//kvcm:param stripsCap in Capacity of strips.
//kvcm:param pix out,nullable,len=pixCap,of=strips.pix,buffer=numPix Receives their pixels.
//kvcm:param pixCap in Capacity of pix.
//kvcm:param numStrips out Receives the number of strips written.
//kvcm:param numPix out Receives the number of pixels written (on KVCM_ERR_BUFFER_TOO_SMALL, those the first strip needs).
//kvcm:param skipped out,nullable,result Receives how many strips were skipped.
type WidgetTakeStrips func(widget Widget, strips spec.Out[Strip], stripsCap spec.Size, pix spec.Out[uint8], pixCap spec.Size, numStrips spec.Out[spec.Size], numPix spec.Out[spec.Size], skipped spec.Out[uint64]) *Status
