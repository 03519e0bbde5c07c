// Interop peer for zkgate integration tests: drives Apache Curator's service discovery
// (curator-x-discovery, ServiceDiscovery<Map>) through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorDiscovery <connectString> <basePath>
//
// stdout: READY once connected; REGISTERED for "register <service> <id> <address> <port>
// <zone>" (payload {"zone": <zone>}, URI template {scheme}://{address}:{port}); UNREGISTERED
// for "unregister" (the instance it registered); for "list <service>", INSTANCES followed by
// each instance as <id>@<address>:<port>,zone=<zone>,uri=<uri>, sorted by id, separated by
// spaces; ERROR <message> on any exception. stdin: those, and "quit" (EOF behaves like quit).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.x.discovery.ServiceDiscovery;
import org.apache.curator.x.discovery.ServiceDiscoveryBuilder;
import org.apache.curator.x.discovery.ServiceInstance;
import org.apache.curator.x.discovery.UriSpec;
import org.apache.curator.x.discovery.details.JsonInstanceSerializer;

public class CuratorDiscovery {
    private static PrintStream out;

    private static void say(String line) {
        out.println(line);
        out.flush();
    }

    @SuppressWarnings({"rawtypes", "unchecked"})
    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 2) {
            say("ERROR usage: CuratorDiscovery <connectString> <basePath>");
            System.exit(1);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        ServiceDiscovery<Map> discovery = ServiceDiscoveryBuilder.builder(Map.class)
                .client(client)
                .basePath(args[1])
                .serializer(new JsonInstanceSerializer<>(Map.class))
                .build();
        discovery.start();
        ServiceInstance<Map> mine = null;
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "register": {
                        Map<String, Object> payload = new HashMap<>();
                        payload.put("zone", words[5]);
                        mine = ServiceInstance.<Map>builder()
                                .name(words[1])
                                .id(words[2])
                                .address(words[3])
                                .port(Integer.parseInt(words[4]))
                                .payload(payload)
                                .uriSpec(new UriSpec("{scheme}://{address}:{port}"))
                                .build();
                        discovery.registerService(mine);
                        say("REGISTERED");
                        break;
                    }
                    case "unregister":
                        discovery.unregisterService(mine);
                        say("UNREGISTERED");
                        break;
                    case "list": {
                        List<String> seen = new ArrayList<>();
                        for (ServiceInstance<Map> instance : discovery.queryForInstances(words[1])) {
                            Object zone = instance.getPayload() == null ? null : instance.getPayload().get("zone");
                            String uri = instance.getUriSpec() == null ? null : instance.buildUriSpec();
                            seen.add(instance.getId() + "@" + instance.getAddress() + ":" + instance.getPort()
                                    + ",zone=" + zone + ",uri=" + uri);
                        }
                        Collections.sort(seen);
                        say(("INSTANCES " + String.join(" ", seen)).trim());
                        break;
                    }
                    case "quit":
                        discovery.close();
                        client.close();
                        return;
                    default:
                        say("ERROR unknown command: " + words[0]);
                }
            } catch (Exception e) {
                say("ERROR " + String.valueOf(e).replace('\n', ' '));
            }
        }
        discovery.close();
        client.close();
    }
}
