package once

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// TestKeyGoldenPayloads pins the canonical payload, the fingerprint and
// the key of payloads of every shape the canonical encoder takes a
// shortcut for, and of the shapes it leaves to encoding/json and RFC
// 8785, as the first release computed them: a faster path must not move
// a single key of a deployed action log.
func TestKeyGoldenPayloads(t *testing.T) {
	want := map[string]struct{ canonical, fp, key string }{
		"nil":                            {"", "cdc888bcc2b422b37a8ee03a264687f7fc666b292cafd9f5e329c041ec469bd4", "e6c31874a7eca9cd09bc955712605b6cdcce1f438349de112685153ddfd191b1"},
		"bytes":                          {"hello, world", "716d6582d32bd7d641eccecc16dc7c4ab6013c71716e10f2521a070da93013c3", "6d6d0616942d4be380ff898b941e6ce3d5b5858893feb767da89aa24ab4e9a65"},
		"bytes empty":                    {"", "cdc888bcc2b422b37a8ee03a264687f7fc666b292cafd9f5e329c041ec469bd4", "e6c31874a7eca9cd09bc955712605b6cdcce1f438349de112685153ddfd191b1"},
		"bytes not UTF-8":                {"\xff\x00\xfe", "e9ebeed6a6e8a659ca388ab812e5737f6a3a39e97f243e4f51077e6c64c327a3", "38f2b8edb98f4dc19a89f1d284674ba919506b00f2e08cf658707f71eeaa1a1a"},
		"string":                         {"\"hello\"", "191c732e3e68a4a50154209b983dfcf1c69e426aab85aebb4e9d0e43822ef283", "8b54a70bd02addef4e9f66b62e37cac55a76fa3a3dc26bed5fb1d0e7ffe9d9b9"},
		"string empty":                   {"\"\"", "e6ed075dc2cdab20e3e9a24b9d2054251163fc97075bee3699cf8ec0ae75c4ba", "47dd7a94a4272d06e43ee5d4b47d88aa4054ac0df293269e24d11e0142d9b1c8"},
		"string escapes":                 {"\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\x7f/<>&\u2028\u2029�\"", "c9dc2b19689b82fc719938428290da224d8fa4a5d07a9fadff654a5082170a7a", "fcb3c91857ac8faef54052bb645a7141823a06748d25d940538b7e3be6de9928"},
		"string non-ASCII":               {"\"café ☕ 😀 דּ\"", "c6ccbec6a27dbbb85aabc80a10f1d1323f9f49fdad1d4ce580fe7c2dc2528aa5", "0be4e56a8f009e298a87191a22c408fbe1ef1264d167b2b0a4d3370ef92ae52e"},
		"bool true":                      {"true", "f554a8a528e0ffa56539f66a79d0fb058356ecfe21cc5a8d16f16f66c7e1f842", "6585575d419d3e69cd6382692ffe80945b2dadad49e33c2ac2602f6777abc063"},
		"bool false":                     {"false", "a8959e5f20345bb3c8a44e5dcefc16c98a9c141c6a982ca442fc0066defc7218", "6f71706c12c732ae3878c1707b7b75775d06b017f73272a0522099ed21f4ef08"},
		"int":                            {"42", "229615dd9f3bb93d0ea4b9f4bb374e8f1f62326640c4526879cf7ec8e6ed2b3e", "337a8d9828922ee61dd4f9a9604b70493eaf493224bf68e124fa6ba91153a823"},
		"int negative":                   {"-7", "8f9c1af4d95ceed740235ccb9af87571f0167db0a952ffbae0c7fdb2fabb8078", "7ab9147fa768887cecb7a13e62445450bcd9cb57d1bbf8db403a3a46d4696fc1"},
		"int zero":                       {"0", "426d753d7155150d43a564c9d71c2da6cec28f36f54b22ea29d6fa68ab088ccd", "06d569b4659768f84e4dac94b249cd24dafb4a2af813348b5616831a633beae8"},
		"int 2^53":                       {"9007199254740992", "39304d5a942e84d21ee9168db85638ed58b4562a87732bbad4f29a1bfc9d049c", "75351773ea77c3b71a27c0a50f6c8715b1cb5e2a4d351be856b317affdfdfbd4"},
		"int -2^53":                      {"-9007199254740992", "57d4bedf847c09cddc700b1cc372e5b0b98046f31aaeff6e5608a9cf3c954c68", "dc14c3ae5762ae995ec0305666cdb685a4d33a4ad988765998708dc9d2c0b2aa"},
		"int8":                           {"-128", "6cd498069d4d2fd823b8eb45853d31f16548d3f12d72a06a6142296403abfaf3", "43237c47ae89a9e3ee7eaf19fc6ddba459bbb5633e577d51cfaf0ed3c265cf14"},
		"int16":                          {"32767", "ac5d82b7d37c5399f6e773918fb7a8a8267746206df361f93f0fe296913635af", "c6f94225761c335f7b8dc41f098dda5eae48ca227956be934cb29626432d2d97"},
		"int32":                          {"-2147483648", "0c7e64f3b0d05dde9ac46c95af9de2c1befd2943621331469093eeb2008ce867", "ae7e4f2dba2d6c4df3910d6679080f906d8e4793c256273b9f1983221de06100"},
		"int64":                          {"1234567890123", "7ad37aeaa7e8a365c49290e505894b2257e5bd9f56db8a9edc37df42325662b8", "04b99dba7735801762a652476a41a638b8b876045953685690569941494f678d"},
		"uint":                           {"7", "33dfacf0f923c7e59bead0ada77aa08d24b2c7aff04c1c42ae32655b4e35e32f", "7461dba3ea9e7cdb358d4ddfe1205003b6ecdf5f9a25181dd86ddd598e4cc80f"},
		"uint8":                          {"255", "35a7b424c503abdc38e05b27979d3665e58fb8328e446d1b40edb67cba8337e4", "71611f86386ee276bf8957a623289419d07518e015529cc26148730ae0caa3b1"},
		"uint16":                         {"65535", "35ebf771297cb87a2f20ea4e91f1f75c1ab4f748e8a71dbd521ee44b79fcbfed", "652de7fa5e1b58aeb38122cfc3cf179992d890a4f37c925fe37a2bc3cadc2e6d"},
		"uint32":                         {"4294967295", "5bb5683bd76a908a4bd259e9fa9977909757c064f3e56cfb0a57024db395e1b2", "da1569bf2f8ed22d10af5bd5aa0458c3e350ffa71a5a0c97325d5ffaa8ee222a"},
		"uint64":                         {"9007199254740992", "39304d5a942e84d21ee9168db85638ed58b4562a87732bbad4f29a1bfc9d049c", "75351773ea77c3b71a27c0a50f6c8715b1cb5e2a4d351be856b317affdfdfbd4"},
		"uintptr":                        {"12", "7358528618b3bc913b70610ab5af65f7f32aff49aa43789168f577f51831c4d6", "3860ce23817791758e13a2bd865624e049be80a991429d092518ed98952d513d"},
		"float64":                        {"1.5", "4804147a42ea2e8ae6bac95ff104358810f2a6bcd90d0bf9c98c8fdee019e712", "a6ba8f16aae098275da8c93073c2a18395e4d55e19cf636c2bd9907456b5c21c"},
		"float64 integral":               {"100", "dfb78ba9713d808c70d6a3edfa6c75b51cec728610581d844e96778b9491938d", "4dbb6cc6a01076f9c32af26c2786e9719c8f50814cf38a8ea9f46dbc3f501558"},
		"float64 negative zero":          {"0", "426d753d7155150d43a564c9d71c2da6cec28f36f54b22ea29d6fa68ab088ccd", "06d569b4659768f84e4dac94b249cd24dafb4a2af813348b5616831a633beae8"},
		"float64 tiny":                   {"1e-7", "a625357027bf6d8b18a7804cf7ef7c42018fac658bbc980bed934023ff48f601", "d774508717bcb578d2067ed4fa2647b1f420c39eaf8b81254aa1234b3daa37c7"},
		"float64 small":                  {"0.000001", "1dd477736ef562fd942d3aeec01b5ddf999fba8373c120b55c356c1e033ba00c", "12c61bf22731c6a79aec639b32b084ca11e50222875b93079dcbb648562fc09b"},
		"float64 large":                  {"1e+21", "de0141f429a7708f54bbf213398c9080a74639f6767ca51767b1bcd948508495", "b70ff78fd710d1354fc1094d75cab38dd0fc6dcbbd087bd04eef5d3d140669e0"},
		"float64 below 1e21":             {"999999999999999900000", "7224340dc9319eb925abe02d3dc1904e2194c17671ff306b469fdf50e8e5e586", "774919fd5b0a7723aed3ae2f4cb2b734b582238d56d5f17cf2c6d5c32d222a37"},
		"float64 third":                  {"0.3333333333333333", "a88d90b128bb1801c60e27f261ac9dca7098c7892bd91363891222dcfb699032", "aa114d3d839b6333cee44ebf4b3a0ff3a78838f163cd0b8d4cfbc46137b8cee9"},
		"float64 max":                    {"1.7976931348623157e+308", "9e182d38b938938745441e631fd32fc97d40802886994c0c8feb68566038e3b1", "2cafe2879c1e294a45bafc9537b34298af7876f8716183e0961d76971d1cb846"},
		"float64 smallest":               {"5e-324", "c37885624d8edaa6c077e7bc1e69b487c084982277664d819f9e8c6a2674c96f", "380809dd4183092b5c3208e2a8dc638ef889daaadaa7a711c99d8efe019d8901"},
		"float64 1e100":                  {"1e+100", "6d1632b41f1fa147adec07fedf03a95296a5f00b80f92bbec7d216e5d788b4e4", "8993c8ef0435ad3ed1a4736cb48b9c889bfeee49d2877890fe06e81d18f1e853"},
		"float32":                        {"0.1", "bd22a681918e7ba357d0be49c8a8c2139ea1cf56f870c566558a3eb151a98549", "70de6876f3d989a5d2416b2e3b2cb0c513b1b92200543c88d28cb6a94741fdb7"},
		"float32 large":                  {"3.4e+38", "38035572097c874c5342653d3cef78df0a4dfd1badbe8482c3c9275c1e4520c6", "01708e2f57f64fa743a8bb6141cc8ff3321af027f87f9164261f72e959047c5e"},
		"json.Number":                    {"100", "dfb78ba9713d808c70d6a3edfa6c75b51cec728610581d844e96778b9491938d", "4dbb6cc6a01076f9c32af26c2786e9719c8f50814cf38a8ea9f46dbc3f501558"},
		"RawMessage":                     {"{\"a\":[100,\"é\"],\"b\":1}", "e34691eb475adb4ae11d3a54a6478becfed964f06fc0f44fd3e17e9cb9dba2f2", "1fad2d0c0b77fa3c2252e79cc1d1a325249bc95bfa236e59acdc260f4930c5f1"},
		"map[string]string":              {"{\"body\":\"hello 7\",\"subject\":\"hi\"}", "11eed77503c139f7e7c6b4af62197d0aca16b1960b8e092e6eed6d216b884b0a", "8168197bb5356b319bec06eb19f5e225c455ea5fa40f5709c2c88c4ae1a69560"},
		"map[string]string empty":        {"{}", "d1c7ba09711b6c2bca6c1ca09b3571ca2581a248177afa602296550bcf2a02eb", "f6bf13905b7dc0e747ef800110d50c8581f658ca7c81c4df24352fb6f4f470a5"},
		"map[string]string nil":          {"null", "89823683db9b800fa04618c3e84fcd1993670aae69b8dea0dac5b557e2383c19", "ce4836eac193962a4f71718a3b6898f2c6bf614163c6fa6a28220f5e44efb318"},
		"map[string]string UTF-16 order": {"{\"\":\"e\",\"<\":\"g\",\"a\u2028\":\"f\",\"z\":\"c\",\"é\":\"d\",\"דּ\":\"b\",\"😀\":\"a\"}", "34eb6e7142232f70a8ee42ecf84a599b5d7031523a1740857659c4007e22faf4", "e3ce2267fd841f48b008060873d1de6978bf2b271050e5b577ef6cd9b9d4af86"},
		"map[string]any":                 {"{\"body\":\"hello 7\",\"n\":3,\"none\":null,\"ok\":true,\"subject\":\"hi\",\"to\":[\"ada@example.com\"]}", "69ab13abdc3256c54172086de9ac6e37aa13bc82e19c174c5ed71c85d61e4832", "a88f9af60520e67a614faecfdfd5022588f0ae173929a32868be6cc1697ce091"},
		"map[string]any nested":          {"{\"a\":[],\"b\":{\"c\":null,\"d\":[3,{\"e\":2.5,\"f\":1}]}}", "edb6124d06f5adfa863b22124ddbe516c8ba18903f7dca6629140a3ac15f7856", "9f54dbe1f8c8630eadca973a025017e881fcebd8cd4af72c6334ca5604ddfd84"},
		"map[string]any numbers":         {"{\"big\":1e+300,\"f\":1,\"i\":1,\"j\":4.5,\"neg\":0,\"u\":3}", "59f8c71c414f2bf874312ed9f99ea238a56a1d40910ec9fbb00d76386db5147e", "1926e1f0c127ac96638d16673ae6aed237ccad2a993dffb6fb03d8c9b418dd3c"},
		"map[string]any raw":             {"{\"r\":{\"x\":2,\"y\":1}}", "e8720c90b2f237c99166e6edf1271da8f38b738db710f465d13ed7ebe00f46ee", "a9fb9db743783ecb54a70fa9c04f19bd51f233e74083fb53ff9e8939ed109d35"},
		"map[string]any bytes":           {"{\"b\":\"AP9oaQ==\",\"nilb\":null}", "3e20a43f14bda0920ce42bd0c799934cc614f953b0b620f57c0f9207c454cc3d", "87bd4887506b2ad34c5246b5d0e08c632a581a15cce1d774d4535cf0bf9f64db"},
		"map[string]int":                 {"{\"a\":1,\"b\":2}", "ca29522825651da43e9cf60672631c11d3a9936df13749e2211a00bb72819077", "ed8a53b77c6e257d689b34207704011e65606be869cbc6ee655a54006f4dd230"},
		"map[goldenNamed]goldenNamed":    {"{\"k\":\"v\"}", "37569629daffe6d0e469169c8efa5da117803a18276b64fe41f3e9c9c690c94d", "5079c5f80afc1962c4726e26bc1758929db21f1feca5f4437e18bbe04b740647"},
		"map[int]string":                 {"{\"10\":\"a\",\"2\":\"b\"}", "e35b25a583e57826396d73c868373e6c21aebbbc0a414c288080ddcb15cbd12c", "2577a8ebee2bcb409f8ada3a8e64de5162e0febbda3a537da0cf3d930745b84e"},
		"map[string][]string":            {"{\"cc\":null,\"to\":[\"a\",\"b\"]}", "7790fe243099f94faca74b6efdb98bdae9a379b3a0e04d6946acd3d8672a252c", "f2af2308659f9d03fe106252643a75fc37c23479547e6cbbfafd0c40ab53d79b"},
		"[]any":                          {"[\"a\",1,true,null,2.5,[],{}]", "f073ad71a090f54f09a488b69ba2d2c59a82543cc05c8d50aeb84a243c195870", "e717c5d3919f371fdcc9a5199a36a1f5cd949924042c6f386ee0ac236be17aeb"},
		"[]any nil":                      {"null", "89823683db9b800fa04618c3e84fcd1993670aae69b8dea0dac5b557e2383c19", "ce4836eac193962a4f71718a3b6898f2c6bf614163c6fa6a28220f5e44efb318"},
		"[]string":                       {"[\"x\",\"y\",\"\"]", "fd96e336e9ff76b4284798dca1e5f374d818a211f416084b875106097c2e82d3", "6f7cbb0ed96321eb04cda9b0ca9be87ead82f2659a87fe3725a37f167db84385"},
		"[]string empty":                 {"[]", "607e0f6503a0d6b7ec9af76688111b3df505d63d2a8d2006569ec1626f66288e", "245bcfdccac23037516c4c44de31010f40f7ae115203335f59fbd83c4bd66f33"},
		"[]int":                          {"[3,-1,0]", "19b120306f86db050cb122cc3e13d08f006a1055c5381bda51d7e0e4911548ef", "6c2c4f0f335f974f124c0bf0f0e4a431610bb37b60f3789131d9e03e24dffafa"},
		"[]float64":                      {"[0.1,1e+21,-2]", "5ff4f96f4fd0935df14e65d867f8c2e1621aa064d23f69f806129515b9055dbc", "1e5188a102f4282c6a055696a22573fee08bcaa47a48b624a2586a9696362b4a"},
		"[]map[string]string":            {"[{\"a\":\"1\"},null]", "83c55f95158923ccc8559e5c20de378dc09f0a9d5ad68b4623e2ffa0ea764bab", "2b9c3cf2714653c5055f40c624019305d9c739710e294a9147806b9f94e0b07a"},
		"[3]int":                         {"[1,2,3]", "128cd0e99cd617a3fcd2e6de5b3aefcf4bdffa5a23da3b464242c5e9df71105e", "e8f961b966257169aded250c000c291c1962a30e65b1729f8ea9e4a453bcff9f"},
		"[2]byte":                        {"[1,2]", "adba024d81de4531949316da04358fdecc537addd7b7260a8e169002def58722", "4f5aa24dc5818aff5b831bce7fe45fe89bddebd4de05116af57387898df80554"},
		"named string":                   {"\"named\"", "be53f4fc13fbf12a68df43a532a576798af1ecb37f4abc3fd41876ca97a20467", "aa034ed778f3afb9388d30d5abf758611c24365aa1dedbcd6eb7891d521a28c2"},
		"struct":                         {"{\"-\":\"z\",\"Ref\":{\"id\":77,\"kind\":\"invoice\"},\"Urgent\":true,\"amount\":9.99,\"blob\":\"AQID\",\"body\":\"hello\",\"extra\":{\"k\":[1,\"2\"]},\"headers\":{\"x-id\":\"1\"},\"retries\":2,\"subject\":\"hi\",\"tags\":[\"a\",\"b\"],\"to\":\"ada@example.com\"}", "c3cbbfa3cfc2478a30ce2912760ab2b3f39248eaecb8dfc2d66cd424f98186aa", "3a5501ab9ce4eaa8eecbca8041202162726ba08f734f8a69db91cccaed031f59"},
		"struct empty fields":            {"{\"-\":\"\",\"Ref\":null,\"Urgent\":false,\"retries\":0,\"subject\":\"\",\"to\":\"\"}", "6c62d3b799f83a32692f54992abb0e43b9dc28553177cbe57df1f3ddc58811ec", "4415df0e578a847eaeca314db838bfb58e9dd06d81b3024474856254c08c7c96"},
		"struct pointer":                 {"{\"-\":\"\",\"Ref\":null,\"Urgent\":false,\"extra\":{\"id\":1,\"kind\":\"\"},\"retries\":0,\"subject\":\"\",\"to\":\"b@example.com\"}", "c8aed7874b2b66d6b75f5849ff5d2ab0882c5a857849320bf4efcbb5cb64a9c7", "c5474bd5dc2f905b511503d9781771406bea5adf1d75fe59d96f69cc8189fc59"},
		"struct nil pointer":             {"null", "89823683db9b800fa04618c3e84fcd1993670aae69b8dea0dac5b557e2383c19", "ce4836eac193962a4f71718a3b6898f2c6bf614163c6fa6a28220f5e44efb318"},
		"struct embedded":                {"{\"id\":5,\"kind\":\"k\",\"note\":\"n\"}", "3410605d49f0da4589708e9a7ccd733d4420d03ca00457613f3b9d203b2514f6", "d0ae4b3f01ee60fdb745136cbeef0f6929043f83ab2f0b95e95d4a3751d03bc7"},
		"struct string tag":              {"{\"n\":\"12\"}", "eda0b35a9bf3bc977da75d13240e405110c452cfa695e3aa23ea4ffb78daa762", "910bd48d66083ea6b47bccd19abfeff42b2d636106b1f7466c217e3d31ee858b"},
		"struct omitzero":                {"{}", "d1c7ba09711b6c2bca6c1ca09b3571ca2581a248177afa602296550bcf2a02eb", "f6bf13905b7dc0e747ef800110d50c8581f658ca7c81c4df24352fb6f4f470a5"},
		"struct tree":                    {"{\"kids\":[{\"kids\":null,\"name\":\"a\"},{\"kids\":[],\"name\":\"b\"}],\"name\":\"root\"}", "77e72712feb334ba4f768604238426674727a0dcc9460506ea17c47f1d59d1d8", "737f39f7ed795ce323a7be80c4fbc48ebc3a8f192b44fa9b9c44bd47d99f30ad"},
		"anonymous struct":               {"{\"a\":\"x\",\"b\":1}", "6628e6273c63ade82302b8ac27f0984e617cdb5467ac2990f14694a59e927195", "c8d1a16acf1d69eed29f4de38452ee7b1b7596c6dcf2e47508b6680e82da51b7"},
		"time":                           {"\"2026-11-30T12:00:00.000000005Z\"", "65564f08e48543a5f7b104cf4c73968a22e03ebea9d6997323c57bf7ab9cd256", "acd7fcc216bdb5dfb79e7e3333aa6de95bbb91f21f5494d82b19020c34758f01"},
		"pointer to string":              {"\"pointed\"", "b2ee944433f7df166528f92cc99e783c2d37ed7822fdf9f4c3fd9c84fb8589cf", "494a5d43a316dec9bfd25bde637a8bbffba514912cabcc2a2581366e9170fd93"},
		"pointer to pointer":             {"3", "7fe8590d80b20aa0c31a03f5a02de0001ff891139781b827bbea5d0c852d9e73", "b2e760909ba194cb477181b699ef1a16c984afb090f79fdaffabc73f92bb45fa"},
		"interface slice of structs":     {"[{\"id\":1,\"kind\":\"a\"},{\"id\":2,\"kind\":\"\"}]", "5606b5bddd8ec67f7ae01eab8194b4b1dca9a4396ecff12f81b2105a6b41bcd6", "622c3890c3da46962be9692ce10e60cb168cf2e448764efc1f186fddac914dcf"},
	}
	payloads := goldenPayloads()
	if len(payloads) != len(want) {
		t.Fatalf("%d payloads, %d golden values", len(payloads), len(want))
	}
	for _, p := range payloads {
		w, ok := want[p.name]
		if !ok {
			t.Fatalf("no golden value for %q", p.name)
		}
		in := Intent{Run: "run-1", Step: 2, Kind: "send_email", Target: "ada@example.com", Payload: p.payload, PayloadInKey: true}
		k, fp, err := KeyOf(in)
		if err != nil {
			t.Errorf("%s: %v", p.name, err)
			continue
		}
		if string(fp) != w.fp || string(k) != w.key {
			t.Errorf("%s: KeyOf = %s / %s, want %s / %s", p.name, k, fp, w.key, w.fp)
		}
		req, _, err := (&Client{settings: settings{maxPayload: DefaultMaxPayloadBytes, def: packageDefaults}}).prepare(in)
		if err != nil || string(req.Payload) != w.canonical || req.Key != k || req.Fingerprint != fp {
			t.Errorf("%s: prepare = %q %s %s (%v), want %q %s %s", p.name, req.Payload, req.Key, req.Fingerprint, err, w.canonical, k, fp)
		}
	}
	// Without PayloadInKey the payload does not reach the key.
	k, _ := mustKey(t, Intent{Run: "run-1", Step: 12345, Kind: "send_email", Target: "ada@example.com", Payload: map[string]string{"a": "b"}})
	if k != "7856f68e0d9c4d5446abe6ba4c6796fbeb1272213ab8cae1b2448cfd9a5dbf7a" {
		t.Errorf("key without the payload = %s", k)
	}
}

// goldenMessage and the types below stand for the payloads callers
// build: plain structs with tags, nested values, pointers, and the
// encoding/json features the canonical form must follow.
type goldenMessage struct {
	To      string            `json:"to"`
	Subject string            `json:"subject"`
	Body    string            `json:"body,omitempty"`
	Tags    []string          `json:"tags,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Retries int               `json:"retries"`
	Urgent  bool
	Amount  float64 `json:"amount,omitempty"`
	Ref     *goldenRef
	Extra   any    `json:"extra,omitempty"`
	Blob    []byte `json:"blob,omitempty"`
	skipped string
	Hidden  string `json:"-"`
	//lint:ignore SA5008 a field named "-" (the tag "-,") is one of the cases the keys must keep
	Dash string `json:"-,"`
}

type goldenRef struct {
	ID   uint64 `json:"id"`
	Kind string `json:"kind"`
}

type goldenNamed string

type goldenEmbedded struct {
	goldenRef
	Note string `json:"note"`
}

type goldenStringTag struct {
	N int64 `json:"n,string"`
}

type goldenZero struct {
	When time.Time `json:"when,omitzero"`
	N    int       `json:"n,omitzero"`
}

type goldenTree struct {
	Name string        `json:"name"`
	Kids []*goldenTree `json:"kids"`
}

// goldenPayloads are the payloads TestKeyGoldenPayloads pins, by name.
func goldenPayloads() []struct {
	name    string
	payload any
} {
	return []struct {
		name    string
		payload any
	}{
		{"nil", nil},
		{"bytes", []byte("hello, world")},
		{"bytes empty", []byte{}},
		{"bytes not UTF-8", []byte{0xff, 0x00, 0xfe}},
		{"string", "hello"},
		{"string empty", ""},
		{"string escapes", "a\"b\\c\b\f\n\r\t\x00\x01\x1f\x7f/<>&\u2028\u2029\ufffd"},
		{"string non-ASCII", "café ☕ 😀 דּ"},
		{"bool true", true},
		{"bool false", false},
		{"int", 42},
		{"int negative", -7},
		{"int zero", 0},
		{"int 2^53", 1 << 53},
		{"int -2^53", -(1 << 53)},
		{"int8", int8(-128)},
		{"int16", int16(32767)},
		{"int32", int32(-2147483648)},
		{"int64", int64(1234567890123)},
		{"uint", uint(7)},
		{"uint8", uint8(255)},
		{"uint16", uint16(65535)},
		{"uint32", uint32(4294967295)},
		{"uint64", uint64(9007199254740992)},
		{"uintptr", uintptr(12)},
		{"float64", 1.5},
		{"float64 integral", 100.0},
		{"float64 negative zero", math.Copysign(0, -1)},
		{"float64 tiny", 1e-7},
		{"float64 small", 0.000001},
		{"float64 large", 1e21},
		{"float64 below 1e21", 999999999999999900000.0},
		{"float64 third", 1.0 / 3},
		{"float64 max", math.MaxFloat64},
		{"float64 smallest", math.SmallestNonzeroFloat64},
		{"float64 1e100", 1e100},
		{"float32", float32(0.1)},
		{"float32 large", float32(3.4e38)},
		{"json.Number", json.Number("1e2")},
		{"RawMessage", json.RawMessage(` {"b":1, "a":[1e2, "\u00e9"]} `)},
		{"map[string]string", map[string]string{"subject": "hi", "body": "hello 7"}},
		{"map[string]string empty", map[string]string{}},
		{"map[string]string nil", map[string]string(nil)},
		{"map[string]string UTF-16 order", map[string]string{"😀": "a", "דּ": "b", "z": "c", "é": "d", "": "e", "a\u2028": "f", "<": "g"}},
		{"map[string]any", map[string]any{"subject": "hi", "body": "hello 7", "n": 3, "ok": true, "to": []any{"ada@example.com"}, "none": nil}},
		{"map[string]any nested", map[string]any{"b": map[string]any{"d": []any{3, map[string]any{"f": 1, "e": 2.5}}, "c": nil}, "a": []any{}}},
		{"map[string]any numbers", map[string]any{"i": 1, "f": 1.0, "u": uint8(3), "neg": math.Copysign(0, -1), "big": 1e300, "j": json.Number("4.50")}},
		{"map[string]any raw", map[string]any{"r": json.RawMessage(`{"y":1,"x":2}`)}},
		{"map[string]any bytes", map[string]any{"b": []byte("\x00\xffhi"), "nilb": []byte(nil)}},
		{"map[string]int", map[string]int{"b": 2, "a": 1}},
		{"map[goldenNamed]goldenNamed", map[goldenNamed]goldenNamed{"k": "v"}},
		{"map[int]string", map[int]string{2: "b", 10: "a"}},
		{"map[string][]string", map[string][]string{"to": {"a", "b"}, "cc": nil}},
		{"[]any", []any{"a", 1, true, nil, 2.5, []any{}, map[string]any{}}},
		{"[]any nil", []any(nil)},
		{"[]string", []string{"x", "y", ""}},
		{"[]string empty", []string{}},
		{"[]int", []int{3, -1, 0}},
		{"[]float64", []float64{0.1, 1e21, -2}},
		{"[]map[string]string", []map[string]string{{"a": "1"}, nil}},
		{"[3]int", [3]int{1, 2, 3}},
		{"[2]byte", [2]byte{1, 2}},
		{"named string", goldenNamed("named")},
		{"struct", goldenMessage{To: "ada@example.com", Subject: "hi", Body: "hello", Tags: []string{"a", "b"}, Headers: map[string]string{"x-id": "1"}, Retries: 2, Urgent: true, Amount: 9.99,
			Ref: &goldenRef{ID: 77, Kind: "invoice"}, Extra: map[string]any{"k": []any{1, "2"}}, Blob: []byte{1, 2, 3}, skipped: "x", Hidden: "y", Dash: "z"}},
		{"struct empty fields", goldenMessage{}},
		{"struct pointer", &goldenMessage{To: "b@example.com", Extra: goldenRef{ID: 1}}},
		{"struct nil pointer", (*goldenMessage)(nil)},
		{"struct embedded", goldenEmbedded{goldenRef: goldenRef{ID: 5, Kind: "k"}, Note: "n"}},
		{"struct string tag", goldenStringTag{N: 12}},
		{"struct omitzero", goldenZero{N: 0}},
		{"struct tree", &goldenTree{Name: "root", Kids: []*goldenTree{{Name: "a"}, {Name: "b", Kids: []*goldenTree{}}}}},
		{"anonymous struct", struct {
			B int    `json:"b"`
			A string `json:"a"`
		}{1, "x"}},
		{"time", time.Date(2026, 11, 30, 12, 0, 0, 5, time.UTC)},
		{"pointer to string", new("pointed")},
		{"pointer to pointer", new(new(3))},
		{"interface slice of structs", []any{goldenRef{ID: 1, Kind: "a"}, &goldenRef{ID: 2}}},
	}
}
